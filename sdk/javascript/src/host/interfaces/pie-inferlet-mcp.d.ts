// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/mcp@0.1.0' {
  /**
   * Sorted names of the MCP servers the inferlet can connect to.
   */
  export function availableServers(): Array<string>;
  /**
   * Open a session with server `name`.
   */
  export function connect(name: string): McpSession;
  /**
   * Close the session; later calls on it fail.
   */
  export function close(session: McpSession): void;
  /**
   * Start a `tools/list` request.
   */
  export function listTools(session: McpSession): number;
  /**
   * The `tools/list` result.
   */
  export function listToolsResult(call: number): Json;
  /**
   * Start calling tool `name` with `arguments` (a JSON object; none = {}).
   */
  export function callTool(session: McpSession, name: string, arguments: Json | null): number;
  /**
   * The `tools/call` result (an mcp-error if the tool reported a failure).
   */
  export function callToolResult(call: number): Json;
  /**
   * Start a `resources/list` request.
   */
  export function listResources(session: McpSession): number;
  /**
   * The `resources/list` result.
   */
  export function listResourcesResult(call: number): Json;
  /**
   * Start reading resource `uri`.
   */
  export function readResource(session: McpSession, uri: string): number;
  /**
   * The `resources/read` result.
   */
  export function readResourceResult(call: number): Json;
  /**
   * Start a `prompts/list` request.
   */
  export function listPrompts(session: McpSession): number;
  /**
   * The `prompts/list` result.
   */
  export function listPromptsResult(call: number): Json;
  /**
   * Start rendering prompt `name` with `arguments` (a JSON object of strings; none = {}).
   */
  export function getPrompt(session: McpSession, name: string, arguments: Json | null): number;
  /**
   * The `prompts/get` result.
   */
  export function getPromptResult(call: number): Json;
  /**
   * The name of the session's server.
   */
  export function serverName(session: McpSession): string;
  /**
   * Whether the session was closed.
   */
  export function isClosed(session: McpSession): boolean;
  export type McpSession = import('pie:inferlet/types@0.1.0').McpSession;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
  export type Json = import('pie:inferlet/types@0.1.0').Json;
}
