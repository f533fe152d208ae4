// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
declare module 'pie:inferlet/poll@0.1.0' {
  /**
   * Block until at least one of `calls` finished or `timeout-ms` passed (none = no limit);
   * returns the indices, into `calls`, of those that finished.
   */
  export function wait(calls: number[], timeoutMs: number | null): number[];
  /**
   * Cancel a call in flight; its `f-result` then returns an error.
   */
  export function cancel(call: number): void;
}
