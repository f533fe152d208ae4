// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/scheduling@0.1.0' {
  /**
   * Credits the inferlet holds in `model`'s market.
   */
  export function balance(model: string): number;
  /**
   * The clearing price per page per tick on the context's pool.
   */
  export function rent(ctx: Context): number;
  /**
   * Credits the last tick paid the inferlet as its share of the rent.
   */
  export function dividend(model: string): number;
  /**
   * Seconds per tick on the context's model (a moving average).
   */
  export function latency(ctx: Context): number;
  /**
   * Credits one new KV page costs.
   */
  export function price(): number;
  /**
   * Bid `value` credits per page per tick for the context's next pass.
   */
  export function setBid(ctx: Context, value: number): void;
  /**
   * Hold the context out of the auction while `idle`.
   */
  export function setIdle(ctx: Context, idle: boolean): void;
  /**
   * The context expects `tokens` more tokens (none = unknown).
   */
  export function setHorizon(ctx: Context, tokens: number | null): void;
  /**
   * Give the context's pages back now; its next pass restores it.
   */
  export function suspend(ctx: Context): void;
  /**
   * Whether the context's pages are off the device.
   */
  export function isSuspended(ctx: Context): boolean;
  export type Context = import('pie:inferlet/types@0.1.0').Context;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
