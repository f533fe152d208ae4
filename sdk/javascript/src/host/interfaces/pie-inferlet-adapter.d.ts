// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/adapter@0.1.0' {
  /**
   * A new all-zero adapter `name` on `model` for the user.
   */
  export function create(model: string, name: string): Adapter;
  /**
   * A new handle to the user's adapter `name`, or none if it does not exist.
   */
  export function openAdapter(model: string, name: string): Adapter | null;
  /**
   * A copy of the adapter's weights (and zo state) under `new-name`.
   */
  export function fork(adapter: Adapter, newName: string): Adapter;
  /**
   * Write the adapter's mean weights to the PEFT folder `path`.
   */
  export function save(adapter: Adapter, path: string): void;
  /**
   * Replace the adapter's weights with the PEFT folder `path`.
   */
  export function load(adapter: Adapter, path: string): void;
  /**
   * Start waiting until the backend ran every operation asked of the adapter so far.
   */
  export function settled(adapter: Adapter): number;
  /**
   * The outcome of `settled` (a backend-error if an operation failed).
   */
  export function settledResult(call: number): void;
  /**
   * Drop this handle now (idempotent).
   */
  export function release(adapter: Adapter): void;
  /**
   * Release from a finaliser, on whatever thread it runs.
   */
  export function releaseSoon(adapter: Adapter): void;
  /**
   * The adapter's name.
   */
  export function name(adapter: Adapter): string;
  /**
   * Fail with pie-error if the handle was released.
   */
  export function checkLive(a: Adapter): void;
  /**
   * Whether the handle was released.
   */
  export function isReleased(a: Adapter): boolean;
  export type Adapter = import('pie:inferlet/types@0.1.0').Adapter;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
