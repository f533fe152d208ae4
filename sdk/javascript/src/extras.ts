import hostAdapter from 'pie:inferlet/adapter@0.1.0';
import hostMcp from 'pie:inferlet/mcp@0.1.0';
import hostScheduling from 'pie:inferlet/scheduling@0.1.0';
import type { Adapter as HostAdapter, McpSession as HostMcpSession } from 'pie:inferlet/types@0.1.0';
import { h } from './errors';
import { hostCall } from './loop';
import type { Context } from './context';
import type { Model } from './model';

/** The backend work of an adapter's `save`, `load` or a `zo` call: it runs before the
 * inferlet's next forward pass whether or not this is awaited; `await` it to wait until it ran
 * (and to see a failure: PieError invalid-input for a folder found unusable, backend-error for
 * the rest). */
export class Scheduled implements PromiseLike<void> {
  private waited: PromiseLike<void> | null = null;
  /** @internal */
  constructor(private readonly handle: HostAdapter) {}
  then<A = void, B = never>(onOk?: ((v: void) => A | PromiseLike<A>) | null,
                            onErr?: ((e: any) => B | PromiseLike<B>) | null): PromiseLike<A | B> {
    if (this.waited === null) {
      this.waited = hostCall(h(() => hostAdapter.settled(this.handle)), (c) => { h(() => hostAdapter.settledResult(c)); });
    }
    return this.waited.then(onOk, onErr);
  }
}

/** A LoRA adapter on a model (`Disposable`: `using a = Adapter.create(model, 'draft')`). */
export class Adapter implements Disposable {
  private constructor(/** @internal */ readonly handle: HostAdapter) {}
  static create(model: Model, name: string): Adapter { return new Adapter(h(() => hostAdapter.create(model.name, name))); }
  static open(model: Model, name: string): Adapter | undefined {
    const found = h(() => hostAdapter.openAdapter(model.name, name));
    return found === null || found === undefined ? undefined : new Adapter(found);
  }
  get name(): string { return h(() => hostAdapter.name(this.handle)); }
  fork(newName: string): Adapter { return new Adapter(h(() => hostAdapter.fork(this.handle, newName))); }
  /** Write the mean weights to the PEFT folder `path` (relative to the scratch directory
   * under pie serve); `await` the result to wait until it is written. */
  save(path: string): Scheduled { h(() => hostAdapter.save(this.handle, path)); return new Scheduled(this.handle); }
  /** Replace the weights with the PEFT folder `path`; `await` the result to wait until loaded. */
  load(path: string): Scheduled { h(() => hostAdapter.load(this.handle, path)); return new Scheduled(this.handle); }
  /** Wait until the backend ran every operation asked of the adapter so far. */
  settled(): Scheduled { return new Scheduled(this.handle); }
  destroy(): void { h(() => hostAdapter.release(this.handle)); }
  [Symbol.dispose](): void { this.destroy(); }
}

/** The inferlet's view of the KV-page market. */
export const scheduling = {
  balance: (model: Model): number => h(() => hostScheduling.balance(model.name)),
  rent: (ctx: Context): number => h(() => hostScheduling.rent(ctx.kv.handle)),
  dividend: (model: Model): number => h(() => hostScheduling.dividend(model.name)),
  latency: (ctx: Context): number => h(() => hostScheduling.latency(ctx.kv.handle)),
  price: (): number => h(() => hostScheduling.price()),
};

const json = (c: number, finish: (c: number) => string) => hostCall(c, (n) => finish(n));

/** A session with one MCP server; results are the raw JSON-RPC result objects as JSON text. */
export class McpSession {
  /** @internal use `mcp.connect` */
  constructor(private readonly handle: HostMcpSession) {}
  get serverName(): string { return h(() => hostMcp.serverName(this.handle)); }
  listTools(): Promise<string> { return json(h(() => hostMcp.listTools(this.handle)), (c) => h(() => hostMcp.listToolsResult(c))) as any; }
  callTool(name: string, args?: object | string): Promise<string> {
    const a = args === undefined ? null : typeof args === 'string' ? args : JSON.stringify(args);
    return json(h(() => hostMcp.callTool(this.handle, name, a)), (c) => h(() => hostMcp.callToolResult(c))) as any;
  }
  listResources(): Promise<string> {
    return json(h(() => hostMcp.listResources(this.handle)), (c) => h(() => hostMcp.listResourcesResult(c))) as any;
  }
  readResource(uri: string): Promise<string> {
    return json(h(() => hostMcp.readResource(this.handle, uri)), (c) => h(() => hostMcp.readResourceResult(c))) as any;
  }
  listPrompts(): Promise<string> {
    return json(h(() => hostMcp.listPrompts(this.handle)), (c) => h(() => hostMcp.listPromptsResult(c))) as any;
  }
  getPrompt(name: string, args?: object): Promise<string> {
    const a = args === undefined ? null : JSON.stringify(args);
    return json(h(() => hostMcp.getPrompt(this.handle, name, a)), (c) => h(() => hostMcp.getPromptResult(c))) as any;
  }
  close(): void { h(() => hostMcp.close(this.handle)); }
}

/** MCP servers the inferlet can call. */
export const mcp = {
  availableServers: (): string[] => h(() => hostMcp.availableServers()),
  connect: (name: string): McpSession => new McpSession(h(() => hostMcp.connect(name))),
};
