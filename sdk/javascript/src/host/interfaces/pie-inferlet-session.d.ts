// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./pie-inferlet-types.d.ts" />
declare module 'pie:inferlet/session@0.1.0' {
  /**
   * Send `text` to the client (a Stdout event).
   */
  export function send(text: string): void;
  /**
   * Send a file to the client (a File event).
   */
  export function sendFile(data: Uint8Array): void;
  /**
   * Start waiting for the next message from the client.
   */
  export function receive(): number;
  /**
   * The client's message.
   */
  export function receiveResult(call: number): string;
  /**
   * Start waiting for the next file from the client.
   */
  export function receiveFile(): number;
  /**
   * The client's file.
   */
  export function receiveFileResult(call: number): Uint8Array;
  /**
   * Send `text` to the client's stderr (a Stderr event).
   */
  export function writeStderr(text: string): void;
  export type Error = import('pie:inferlet/types@0.1.0').Error;
}
