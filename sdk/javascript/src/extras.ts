import hostAdapter from 'pie:inferlet/adapter@0.1.0';
import hostMcp from 'pie:inferlet/mcp@0.1.0';
import hostScheduling from 'pie:inferlet/scheduling@0.1.0';
import { h } from './errors';
import { hostCall } from './loop';
import type { Context } from './context';
import type { Model } from './model';

/** A LoRA adapter on a model (`Disposable`: `using a = Adapter.create(model, 'draft')`). */
export class Adapter implements Disposable {
  private constructor(/** @internal */ readonly handle: any) {}
  static create(model: Model, name: string): Adapter { return new Adapter(h(() => hostAdapter.create(model.name, name))); }
  static open(model: Model, name: string): Adapter | undefined {
    const found = h(() => hostAdapter.openAdapter(model.name, name));
    return found === null || found === undefined ? undefined : new Adapter(found);
  }
  get name(): string { return h(() => hostAdapter.name(this.handle)); }
  fork(newName: string): Adapter { return new Adapter(h(() => hostAdapter.fork(this.handle, newName))); }
  save(path: string): void { h(() => hostAdapter.save(this.handle, path)); }
  load(path: string): void { h(() => hostAdapter.load(this.handle, path)); }
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
  constructor(private readonly handle: any) {}
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
