// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/runtime@0.1.0' {
  /**
   * Names of every model the engine has loaded.
   */
  export function models(): Array<string>;
  /**
   * The Pie runtime version.
   */
  export function version(): string;
  /**
   * Unique id of this engine instance.
   */
  export function instanceId(): string;
  /**
   * The user who launched the inferlet.
   */
  export function username(): string;
  /**
   * Start running inferlet `name` (or `name@version`) with `args` (a JSON object) as the same user.
   */
  export function spawn(name: string, args: Json | null): number;
  /**
   * The spawned inferlet's result.
   */
  export function spawnResult(call: number): Json;
  /**
   * The user's private scratch directory.
   */
  export function scratchDir(): string;
  /**
   * The absolute path of `relative` inside the scratch directory.
   */
  export function scratchPath(relative: string): string;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
  export type Json = import('pie:inferlet/types@0.1.0').Json;
}
