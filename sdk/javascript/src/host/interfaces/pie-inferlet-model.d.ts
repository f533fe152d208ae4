// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/model@0.1.0' {
  /**
   * The loaded model called `name`.
   */
  export function resolve(name: string): Model;
  /**
   * Rows of the model's output layer: valid token ids are below it.
   */
  export function vocabSize(name: string): number;
  /**
   * Text to token ids (special tokens in the text recognised; no BOS added).
   */
  export function tokenize(name: string, text: string): number[];
  /**
   * Token ids to text.
   */
  export function detokenize(name: string, tokens: number[]): string;
  /**
   * The raw bytes each token contributes.
   */
  export function tokenBytes(name: string, tokens: number[]): Array<Uint8Array>;
  /**
   * The whole vocabulary as parallel lists of ids and token bytes.
   */
  export function vocabs(name: string): [number[], Array<Uint8Array>];
  /**
   * Special token ids and their bytes.
   */
  export function specialTokens(name: string): [number[], Array<Uint8Array>];
  /**
   * The pre-tokenisation split regex.
   */
  export function splitRegex(name: string): string;
  /**
   * Tokens of one chat piece (`role`: system, user, assistant, cue or seal), without state.
   */
  export function chatTokens(name: string, role: string, text: string): number[];
  /**
   * A stateful builder for one conversation in the model's chat format.
   */
  export function chatBuilder(name: string): ChatBuilderHandle;
  /**
   * Token ids that end an assistant turn.
   */
  export function stopTokens(name: string): number[];
  /**
   * Token ids that open and close a reasoning block, or none.
   */
  export function reasoningMarkers(name: string): [number, number] | null;
  /**
   * Tokens of a system message.
   */
  export function chatSystem(b: ChatBuilderHandle, text: string): number[];
  /**
   * Tokens of a complete user turn.
   */
  export function chatUser(b: ChatBuilderHandle, text: string): number[];
  /**
   * Tokens of a complete (pre-filled) assistant turn.
   */
  export function chatAssistant(b: ChatBuilderHandle, text: string): number[];
  /**
   * Tokens that open the assistant's turn for generation.
   */
  export function chatCue(b: ChatBuilderHandle): number[];
  /**
   * Tokens that close an assistant turn opened by `chat-cue`.
   */
  export function chatSeal(b: ChatBuilderHandle): number[];
  /**
   * Tokens that open the conversation listing `tools` (normalised schemas), with `system` text.
   */
  export function chatEquip(b: ChatBuilderHandle, tools: Array<Json>, system: string | null): number[];
  /**
   * Tokens of a turn carrying tool `name`'s result `value`.
   */
  export function chatAnswer(b: ChatBuilderHandle, name: string, value: Json): number[];
  /**
   * An independent builder in the same state.
   */
  export function chatCopy(b: ChatBuilderHandle): ChatBuilderHandle;
  export type Model = import('pie:inferlet/types@0.1.0').Model;
  export type ChatBuilderHandle = import('pie:inferlet/types@0.1.0').ChatBuilder;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
  export type Json = import('pie:inferlet/types@0.1.0').Json;
}
