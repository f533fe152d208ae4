// The inferlet SDK for JavaScript and TypeScript: `import { ... } from 'inferlet'`.
/// <reference path="./host/inferlet.d.ts" preserve="true" />
import { installLoop, runMain } from './loop';
import { asError } from './errors';

installLoop(); // before any other module makes a promise (see loop.ts)

declare global {
  /** Run `handler` once `timeout` ms passed (the SDK's timer: the wait is in the host). */
  function setTimeout(handler: (...args: any[]) => void, timeout?: number, ...args: any[]): number;
  /** Cancel a `setTimeout` timer. */
  function clearTimeout(id: number | undefined): void;
}

export { Model, Tokenizer } from './model';
export { Context } from './context';
export { Forward, Output } from './forward';
export type { SampleHandle, ProbeHandle } from './forward';
export { Generator, GenStep } from './generator';
export type { GenerateOptions } from './generator';
export { Sampler, Logits, Distribution, Logprob, Logprobs, Entropy } from './sampler';
export type { Probe } from './sampler';
export { runtime, session, messaging, Subscription } from './io';
export { Grammar, GrammarConstraint, Matcher, jsonSchema, anyJson, regex, ebnf, grammar } from './grammar';
export type { Schema, Constraint } from './grammar';
export { PieError } from './errors';
export { Adapter, Scheduled, scheduling, mcp, McpSession } from './extras';
export type { Speculator } from './spec';
export { DRAFTS_PER_PASS } from './forward';
export * as chat from './chat';
export * as reasoning from './reasoning';
export * as tools from './tools';
export * as zo from './zo';

/** @internal The component's `run` export: `request` is `{"entry", "input"}` as JSON; returns
 * main's value as JSON, or throws the error text (the Error event). */
export function __run(main: (input: any) => unknown, request: string): string {
  if (typeof main !== 'function') throw 'the inferlet has no `export async function main(input)`';
  const { input } = JSON.parse(request);
  try {
    const value = runMain(() => main(input));
    return JSON.stringify(value === undefined ? null : value);
  } catch (e) {
    const err = asError(e);
    throw err instanceof Error ? `${err.name}: ${err.message}` : `Error: ${String(err)}`;
  }
}
