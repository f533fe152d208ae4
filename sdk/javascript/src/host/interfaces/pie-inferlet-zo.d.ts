// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/zo@0.1.0' {
  /**
   * Reset `adapter` for zo training at rank `rank` with the given population and step size.
   */
  export function initialize(adapter: Adapter, rank: number, alpha: number, populationSize: number, muFraction: number, initialSigma: number): void;
  /**
   * Move the adapter's mean toward the better-scored candidates (`scores[i]` ran with `seeds[i]`).
   */
  export function update(adapter: Adapter, scores: number[], seeds: number[], maxSigma: number): void;
  export type Adapter = import('pie:inferlet/types@0.1.0').Adapter;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
