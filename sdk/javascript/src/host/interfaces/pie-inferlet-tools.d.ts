// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/tools@0.1.0' {
  /**
   * Tool schemas (`schemas`: a JSON array of objects or JSON strings) in the function-tool shape.
   */
  export function normalize(schemas: Json): Array<Json>;
  /**
   * How model `name` writes tool calls, or none.
   */
  export function syntax(name: string): ToolCallSyntax | null;
  /**
   * Tokens that open a conversation listing the tools, with `system` text (none = the template's).
   */
  export function equipPrefix(name: string, schemas: Json, system: string | null): number[];
  /**
   * Tokens of a turn carrying tool `tool`'s result `value`.
   */
  export function answerPrefix(name: string, tool: string, value: Json): number[];
  /**
   * Complete tool calls in `text` as (tool name, JSON arguments).
   */
  export function parseCalls(name: string, text: string): Array<[string, string]>;
  /**
   * The text of a call to `tool` with `args` as model `name` writes it.
   */
  export function formatCall(name: string, tool: string, args: Json): string;
  /**
   * A grammar over the model's tool-call syntax for these tools (`choice`: auto, required or a tool name), or none.
   */
  export function callGrammar(name: string, schemas: Json, choice: string): GrammarSource | null;
  export type GrammarSource = import('pie:inferlet/types@0.1.0').GrammarSource;
  export type ToolCallSyntax = import('pie:inferlet/types@0.1.0').ToolCallSyntax;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
  export type Json = import('pie:inferlet/types@0.1.0').Json;
}
