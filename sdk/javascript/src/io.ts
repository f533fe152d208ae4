import hostRuntime from 'pie:inferlet/runtime@0.1.0';
import hostSession from 'pie:inferlet/session@0.1.0';
import hostMessaging from 'pie:inferlet/messaging@0.1.0';
import type { Subscription as HostSubscription } from 'pie:inferlet/types@0.1.0';
import { h } from './errors';
import { hostCall } from './loop';

/** Facts about the engine and this instance. */
export const runtime = {
  models: (): string[] => h(() => hostRuntime.models()),
  version: (): string => h(() => hostRuntime.version()),
  instanceId: (): string => h(() => hostRuntime.instanceId()),
  username: (): string => h(() => hostRuntime.username()),
  /** The user's private scratch directory as this inferlet sees it (`/scratch`); files there
   * outlive the run (a Pie for Python addition). */
  scratchDir: (): string => h(() => hostRuntime.scratchDir()),
  /** The path of `relative` inside the scratch directory, as this inferlet sees it (parent
   * folders created). Throws PieError invalid-input for an absolute path or one that leaves it. */
  scratchPath: (relative: string): string => h(() => hostRuntime.scratchPath(relative)),
  /** Run inferlet `name` with `args` as the same user; its return value. */
  spawn: (name: string, args?: object): Promise<unknown> => {
    const call = h(() => hostRuntime.spawn(name, args === undefined ? null : JSON.stringify(args)));
    return hostCall(call, (c) => JSON.parse(h(() => hostRuntime.spawnResult(c)))) as any;
  },
};

/** The channel to the client. */
export const session = {
  /** Send to the client: strings verbatim, other values JSON-encoded. */
  send: (message: unknown): void => { h(() => hostSession.send(typeof message === 'string' ? message : JSON.stringify(message))); },
  sendFile: (data: Uint8Array): void => { h(() => hostSession.sendFile(data)); },
  receive: (): Promise<string> => hostCall(h(() => hostSession.receive()), (c) => h(() => hostSession.receiveResult(c))) as any,
  receiveFile: (): Promise<Uint8Array> =>
    hostCall(h(() => hostSession.receiveFile()), (c) => Uint8Array.from(h(() => hostSession.receiveFileResult(c)))) as any,
};

/** A subscription to one broadcast topic. */
export class Subscription implements AsyncIterable<string>, Disposable {
  /** @internal use `messaging.subscribe` */
  constructor(private readonly handle: HostSubscription) {}
  get topic(): string { return h(() => hostMessaging.subscriptionTopic(this.handle)); }
  /** The next broadcast, or undefined once unsubscribed. */
  next(): Promise<string | undefined> {
    return hostCall(h(() => hostMessaging.nextMessage(this.handle)),
      (c) => h(() => hostMessaging.nextMessageResult(c)) ?? undefined) as any;
  }
  unsubscribe(): void { h(() => hostMessaging.unsubscribe(this.handle)); }
  [Symbol.dispose](): void { this.unsubscribe(); }
  [Symbol.asyncIterator](): AsyncIterator<string> {
    return { next: async () => { const m = await this.next(); return m === undefined ? { done: true, value: undefined } : { done: false, value: m }; } };
  }
}

/** Pub/sub topics and queues between the user's inferlets. */
export const messaging = {
  broadcast: (topic: string, message: string): void => { h(() => hostMessaging.broadcast(topic, message)); },
  subscribe: (topic: string): Subscription => new Subscription(h(() => hostMessaging.subscribe(topic))),
  push: (topic: string, message: string): void => { h(() => hostMessaging.push(topic, message)); },
  pull: (topic: string): Promise<string> =>
    hostCall(h(() => hostMessaging.pull(topic)), (c) => h(() => hostMessaging.pullResult(c))) as any,
};
