import context from 'pie:inferlet/context@0.1.0';
import hostModel from 'pie:inferlet/model@0.1.0';
import scheduling from 'pie:inferlet/scheduling@0.1.0';
import hostTools from 'pie:inferlet/tools@0.1.0';
import type { ChatBuilder, Context as HostContext } from 'pie:inferlet/types@0.1.0';
import { h } from './errors';
import { Forward, Kv, settled } from './forward';
import { Generator, GenerateOptions } from './generator';
import { Model } from './model';
import type { Sampler } from './sampler';

/** A KV-cache context on one model plus the SDK-side buffer of tokens not yet run. Chat helpers
 * and `append` add to the buffer; `await flush()` (or a generator's first step) runs it. */
export class Context implements Disposable {
  /** @internal */ kv: Kv;
  private chat: ChatBuilder;
  private pending: number[];

  constructor(readonly model: Model, /** @internal */ opened?: { handle: HostContext; buffer: number[]; chat: ChatBuilder | null; length?: number }) {
    if (!(model instanceof Model)) throw new TypeError('new Context(model) needs a Model (from Model.load)');
    if (opened) {
      this.kv = { handle: opened.handle, length: opened.length ?? h(() => context.seqLen(opened.handle)), released: false,
                  epoch: 0, ahead: [] };
      this.pending = opened.buffer.slice();
      this.chat = opened.chat ?? h(() => hostModel.chatBuilder(this.model.name));
    } else {
      this.kv = { handle: h(() => context.create(model.name)), length: 0, released: false, epoch: 0, ahead: [] };
      this.pending = [];
      this.chat = h(() => hostModel.chatBuilder(model.name));
    }
  }

  private static opened(m: Model, found: [HostContext, number[], ChatBuilder | null] | null): Context | undefined {
    if (found === null || found === undefined) return undefined;
    const [handle, buffer, chat] = found;
    return new Context(m, { handle, buffer: Array.from(buffer), chat });
  }
  /** A new context cloned from snapshot `name`, or undefined. */
  static open(m: Model, name: string): Context | undefined { return Context.opened(m, h(() => context.openSnapshot(m.name, name))); }
  /** Take snapshot `name` (it is removed), or undefined. */
  static take(m: Model, name: string): Context | undefined { return Context.opened(m, h(() => context.takeSnapshot(m.name, name))); }
  /** Drop snapshot `name`. */
  static delete(m: Model, name: string): void { h(() => context.deleteSnapshot(m.name, name)); }

  /** A copy-on-write clone: shares committed pages, copies the buffer and the conversation. */
  fork(): Context {
    const handle = h(() => context.fork(this.live()));
    return new Context(this.model, { handle, buffer: this.pending, chat: h(() => hostModel.chatCopy(this.chat)), length: this.kv.length });
  }
  save(name: string): void { h(() => context.save(this.live(), name, this.pending, this.chat)); }
  snapshot(): string { return h(() => context.snapshot(this.live(), this.pending, this.chat)); }
  /** Free the context's pages now (idempotent). */
  release(): void {
    if (this.kv.released) return;
    this.kv.released = true;
    h(() => context.release(this.kv.handle));
  }
  [Symbol.dispose](): void { this.release(); }

  get pageSize(): number { return h(() => context.pageSize(this.live())); }
  get seqLen(): number {
    if (this.kv.released) throw new Error('this context was released; create a new Context');
    return this.kv.length;
  }
  buffer(): Uint32Array { return Uint32Array.from(this.pending); }

  system(text: string): this { return this.append(h(() => hostModel.chatSystem(this.chat, text))); }
  user(text: string): this { return this.append(h(() => hostModel.chatUser(this.chat, text))); }
  assistant(text: string): this { return this.append(h(() => hostModel.chatAssistant(this.chat, text))); }
  cue(): this { return this.append(h(() => hostModel.chatCue(this.chat))); }
  /** List tools for the model as its chat template does; call it before the first message.
   * `schemas`: one JSON Schema per tool, objects or JSON text (see `tools.equipPrefix`);
   * `system`: text to go with them (default: the template's own). */
  equipTools(schemas: Iterable<object | string>, system?: string): this {
    const list = Array.from(schemas, (x) => (typeof x === 'string' ? JSON.parse(x) : x));
    const normal = h(() => hostTools.normalize(JSON.stringify(list)));
    return this.append(h(() => hostModel.chatEquip(this.chat, normal, system ?? null)));
  }
  /** Add a turn carrying tool `name`'s result (a string, or an object/array: JSON-encoded). Qwen's
   * template writes consecutive results as one turn: they wait in the conversation until the
   * next message or cue. */
  answerTool(name: string, value: unknown): this {
    return this.append(h(() => hostModel.chatAnswer(this.chat, name, JSON.stringify(value))));
  }
  seal(): this { return this.append(h(() => hostModel.chatSeal(this.chat))); }
  append(tokens: Iterable<number>): this {
    for (const t of tokens) this.pending.push(t);
    return this;
  }
  appendText(text: string): this { return this.append(h(() => hostModel.tokenize(this.model.name, text))); }

  /** Run prefill on the buffered tokens. */
  async flush(): Promise<void> {
    if (this.kv.released) throw new Error('this context was released; create a new Context');
    if (this.pending.length) await this.forward(true).execute();
  }
  /** Drop the trailing `n` working-page tokens. */
  truncate(n: number): void {
    h(() => context.truncate(this.live(), n));
    this.kv.length -= n;
    this.kv.epoch++;
  }
  /** A forward pass; with `flush` it starts with (and takes) the buffered tokens. */
  forward(flush = false): Forward {
    if (this.kv.released) throw new Error('this context was released; create a new Context');
    const taken = flush ? this.pending.splice(0, this.pending.length) : [];
    return new Forward(this.kv, taken, () => {
      this.pending.unshift(...taken);
      this.kv.epoch++;
      if (!this.kv.released) this.kv.length = h(() => context.seqLen(this.kv.handle));
    });
  }
  generate(sampler: Sampler, options: GenerateOptions = {}): Generator {
    return new Generator(this, sampler, options);
  }
  /** Bid `value` credits per page per tick for the next pass. */
  setBid(value: number): void { h(() => scheduling.setBid(this.live(), value)); }
  /** Hold the context out of the auction until the returned guard is disposed. */
  idle(): Disposable {
    h(() => scheduling.setIdle(this.live(), true));
    return { [Symbol.dispose]: () => { if (!this.kv.released) h(() => scheduling.setIdle(this.kv.handle, false)); } };
  }
  private live(): HostContext { return settled(this.kv); }
  /** @internal The buffered tokens, shared (the generator's decode loop reads and takes them). */
  pendingTokens(): number[] { return this.pending; }
}
