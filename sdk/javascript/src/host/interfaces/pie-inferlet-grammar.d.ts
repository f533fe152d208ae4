// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/grammar@0.1.0' {
  /**
   * A source for JSON conforming to `schema` (a JSON Schema, or true/false).
   */
  export function jsonSchema(schema: Json, whitespace: boolean): GrammarSource;
  /**
   * A source for any JSON value.
   */
  export function anyJson(whitespace: boolean): GrammarSource;
  /**
   * A source for strings that match `pattern` in full.
   */
  export function regex(pattern: string): GrammarSource;
  /**
   * A source for a GBNF or Lark grammar.
   */
  export function ebnf(text: string): GrammarSource;
  /**
   * A source for an xgrammar structural tag (JSON text).
   */
  export function structuralTag(tagJson: string): GrammarSource;
  /**
   * A matcher for `source` on model `name`; compilation starts now (`timeout` in seconds).
   */
  export function matcher(name: string, source: GrammarSource, timeout: number | null): MatcherHandle;
  /**
   * Start waiting until the matcher's grammar is compiled.
   */
  export function matcherReady(m: MatcherHandle): number;
  /**
   * The outcome of `matcher-ready` (invalid-input if the grammar did not compile in time).
   */
  export function matcherReadyResult(call: number): void;
  /**
   * Whether the matcher's grammar is compiled.
   */
  export function matcherIsReady(m: MatcherHandle): boolean;
  /**
   * Advance over `tokens`, all or none.
   */
  export function matcherAccept(m: MatcherHandle, tokens: number[]): void;
  /**
   * Advance over `token` if allowed; false (unchanged) if not.
   */
  export function matcherTryAccept(m: MatcherHandle, token: number): boolean;
  /**
   * Whether `token` is allowed next.
   */
  export function matcherAllows(m: MatcherHandle, token: number): boolean;
  /**
   * The tokens allowed next as a packed mask.
   */
  export function matcherPacked(m: MatcherHandle): Uint8Array;
  /**
   * The tokens allowed next as BRLE runs.
   */
  export function matcherRuns(m: MatcherHandle): number[];
  /**
   * Back to the grammar's start.
   */
  export function matcherReset(m: MatcherHandle): void;
  /**
   * Undo the last `n` accepted tokens.
   */
  export function matcherRollback(m: MatcherHandle, n: number): void;
  /**
   * An independent matcher in the same state.
   */
  export function matcherFork(m: MatcherHandle): MatcherHandle;
  /**
   * The tokens the matcher's grammar ends on.
   */
  export function matcherStopIds(m: MatcherHandle): number[];
  /**
   * True once the matcher accepted a stop token.
   */
  export function matcherIsTerminated(m: MatcherHandle): boolean;
  /**
   * True when a stop token is allowed now.
   */
  export function matcherCanEnd(m: MatcherHandle): boolean;
  /**
   * The name of the model whose vocabulary the matcher walks.
   */
  export function matcherModel(m: MatcherHandle): string;
  /**
   * Fail with unsupported unless model `name`'s backend applies logit masks.
   */
  export function checkMasks(name: string): void;
  /**
   * A BRLE vocabulary mask of model `name`, packed 8 tokens per byte, little bit order.
   */
  export function packedMask(name: string, runs: number[]): Uint8Array;
  /**
   * A packed vocabulary mask of model `name` as BRLE runs.
   */
  export function maskRuns(name: string, packed: Uint8Array): number[];
  /**
   * Tokens a grammar may end on for model `name`: its chat stop tokens and EOS ids.
   */
  export function stopIds(name: string): number[];
  export type MatcherHandle = import('pie:inferlet/types@0.1.0').Matcher;
  export type GrammarSource = import('pie:inferlet/types@0.1.0').GrammarSource;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
  export type Json = import('pie:inferlet/types@0.1.0').Json;
}
