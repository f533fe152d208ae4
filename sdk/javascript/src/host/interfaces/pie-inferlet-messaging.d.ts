// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/messaging@0.1.0' {
  /**
   * Publish `message` to every subscriber of `topic`.
   */
  export function broadcast(topic: string, message: string): void;
  /**
   * Subscribe to `topic`.
   */
  export function subscribe(topic: string): Subscription;
  /**
   * Close a subscription.
   */
  export function unsubscribe(sub: Subscription): void;
  /**
   * Start waiting for the next broadcast on `sub`.
   */
  export function nextMessage(sub: Subscription): number;
  /**
   * The next broadcast, or none once unsubscribed.
   */
  export function nextMessageResult(call: number): string | null;
  /**
   * Append `message` to queue `topic`.
   */
  export function push(topic: string, message: string): void;
  /**
   * Start waiting for the next message of queue `topic`.
   */
  export function pull(topic: string): number;
  /**
   * The message taken off the queue.
   */
  export function pullResult(call: number): string;
  /**
   * The subscription's topic.
   */
  export function subscriptionTopic(sub: Subscription): string;
  /**
   * Whether the subscription was closed.
   */
  export function subscriptionClosed(sub: Subscription): boolean;
  export type Subscription = import('pie:inferlet/types@0.1.0').Subscription;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
