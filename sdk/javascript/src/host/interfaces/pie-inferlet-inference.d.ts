// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/inference@0.1.0' {
  /**
   * Start one forward pass of `ctx` over `tokens` (masks are BRLE runs; `drafts` trailing
   * tokens are drafts to verify; a nonzero `zo-seed` perturbs `adapter`). `ahead` more passes
   * like this one, each on the token sampled before it, may start before they are asked
   * (`forward-next`), unless that token is in `stop`.
   */
  export function forward(ctx: Context, tokens: number[], positions: number[] | null, attentionMasks: Array<number[]> | null, logitMask: number[] | null, samples: Array<SampleSpec>, probes: Array<ProbeSpec>, drafts: number, adapter: Adapter | null, zoSeed: number, ahead: number, stop: number[]): number;
  /**
   * The pass's tokens per sample and values per probe.
   */
  export function forwardResult(call: number): RequestOutput;
  /**
   * Start the next pass of the decode loop `forward` started with `ahead` on `ctx` (the token
   * its last pass sampled, at the next position, the same samples and probes), usually run
   * already; fails when no loop runs on the context.
   */
  export function forwardNext(ctx: Context): number;
  /**
   * That pass's tokens per sample and values per probe, then those of each pass after it that
   * ran already, in order; all are recorded in the context.
   */
  export function forwardNextResult(call: number): Array<RequestOutput>;
  export type Context = import('pie:inferlet/types@0.1.0').Context;
  export type Adapter = import('pie:inferlet/types@0.1.0').Adapter;
  export type SampleSpec = import('pie:inferlet/types@0.1.0').SampleSpec;
  export type ProbeSpec = import('pie:inferlet/types@0.1.0').ProbeSpec;
  export type RequestOutput = import('pie:inferlet/types@0.1.0').RequestOutput;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
