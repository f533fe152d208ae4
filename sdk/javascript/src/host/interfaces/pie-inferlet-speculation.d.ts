// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/speculation@0.1.0' {
  /**
   * Up to `limit` draft tokens to follow the context's tokens and then `pending`.
   */
  export function systemDraft(ctx: Context, pending: number[], limit: number): number[];
  export type Context = import('pie:inferlet/types@0.1.0').Context;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
