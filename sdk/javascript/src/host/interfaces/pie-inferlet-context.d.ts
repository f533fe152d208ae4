// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/context@0.1.0' {
  /**
   * A fresh empty context on `model`.
   */
  export function create(model: string): Context;
  /**
   * Free the context's pages now (idempotent).
   */
  export function release(ctx: Context): void;
  /**
   * Release from a finaliser, on whatever thread it runs.
   */
  export function releaseSoon(ctx: Context): void;
  /**
   * Tokens in the KV cache (committed and working).
   */
  export function seqLen(ctx: Context): number;
  /**
   * Tokens per KV page.
   */
  export function pageSize(ctx: Context): number;
  /**
   * Drop the trailing `n` working tokens.
   */
  export function truncate(ctx: Context, n: number): void;
  /**
   * A copy-on-write clone owned by the caller.
   */
  export function fork(ctx: Context): Context;
  /**
   * Snapshot the context under `name` for the user, with the SDK's buffer of tokens not yet
   * run and a copy of its conversation builder beside it.
   */
  export function save(ctx: Context, name: string, buffer: number[], chat: ChatBuilder | null): void;
  /**
   * Snapshot under a generated name and return the name.
   */
  export function snapshot(ctx: Context, buffer: number[], chat: ChatBuilder | null): string;
  /**
   * A new context cloned from snapshot `name`, with its buffer and a copy of its builder; none
   * if it is absent.
   */
  export function openSnapshot(model: string, name: string): [Context, number[], ChatBuilder | null] | null;
  /**
   * Remove snapshot `name` and return it as a context (no copy) with its buffer and builder,
   * or none.
   */
  export function takeSnapshot(model: string, name: string): [Context, number[], ChatBuilder | null] | null;
  /**
   * Drop snapshot `name` (no error if it is absent).
   */
  export function deleteSnapshot(model: string, name: string): void;
  /**
   * Pre-allocate `n` working pages (all or none).
   */
  export function reserveWorkingPages(ctx: Context, n: number): void;
  /**
   * Promote `k` full working pages to committed.
   */
  export function commitWorkingPages(ctx: Context, k: number): void;
  /**
   * Free `n` empty working pages from the end.
   */
  export function releaseWorkingPages(ctx: Context, n: number): void;
  /**
   * Committed (full, immutable, shareable) pages.
   */
  export function committedPageCount(ctx: Context): number;
  /**
   * Working pages, reserved empty ones included.
   */
  export function workingPageCount(ctx: Context): number;
  /**
   * Tokens held in working pages.
   */
  export function workingPageTokenCount(ctx: Context): number;
  /**
   * Fail with pie-error if the context was released.
   */
  export function checkLive(ctx: Context): void;
  /**
   * Whether the context was released.
   */
  export function isReleased(ctx: Context): boolean;
  export type Context = import('pie:inferlet/types@0.1.0').Context;
  export type ChatBuilder = import('pie:inferlet/types@0.1.0').ChatBuilder;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
