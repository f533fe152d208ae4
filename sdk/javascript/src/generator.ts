import hostModel from 'pie:inferlet/model@0.1.0';
import inference from 'pie:inferlet/inference@0.1.0';
import hostContext from 'pie:inferlet/context@0.1.0';
import { hostCall } from './loop';
import { h } from './errors';
import { Output, ProbeHandle, SampleHandle } from './forward';
import type { Context } from './context';
import type { Probe, Sampler } from './sampler';
import { Decoder } from './chat';
import { ConstraintSet, anyJson, jsonSchema } from './grammar';

export interface GenerateOptions {
  /** Stop after n accepted tokens. */
  maxTokens?: number;
  /** Stop-token ids (default with autoFlush: the chat template's). */
  stop?: Iterable<number>;
  /** Default true: append cue() first and use the chat stop tokens. */
  autoFlush?: boolean;
  /** A Schema or Constraint, or several (ANDed). */
  constrain?: unknown;
  /** A static BRLE mask applied every step (composes with constrain). */
  logitMask?: Iterable<number>;
  /** A LoRA adapter for every step. */
  adapter?: { readonly handle: any } | null;
  /** Evolution Strategies seed for every forward pass. */
  zoSeed?: number;
}

/** The decode loop of a context: each step runs the buffered tokens and samples the next token.
 * A stop token ends generation and is not accepted (nor counted, nor put in the context). */
export class Generator implements AsyncIterable<GenStep> {
  private max: number | undefined;
  private stopSet: Set<number>;
  private accepted: number[] = [];
  private done = false;
  /** @internal */ eachStep: [number, Probe][] = [];
  /** @internal */ rules: ConstraintSet | null = null;
  /** @internal bumped whenever the steps' pass would change */ config = 0;
  /** @internal */ adapterOpt: { readonly handle: any } | null = null;
  /** @internal */ zo = 0;
  /** @internal the decode loop the engine runs ahead of this generator */
  loop: { epoch: number; token: number; config: number; handle: SampleHandle } | null = null;

  constructor(/** @internal */ readonly ctx: Context, /** @internal */ readonly sampler: Sampler, options: GenerateOptions = {}) {
    this.max = checkMax(options.maxTokens);
    this.adapterOpt = options.adapter ?? null;
    this.zo = options.zoSeed ?? 0;
    if (options.logitMask !== undefined) this.rules = new ConstraintSet(ctx.model, Array.from(options.logitMask));
    if (options.constrain !== undefined) this.constrain(options.constrain);
    const auto = options.autoFlush ?? true;
    if (auto) ctx.cue();
    const stop = options.stop ?? (auto ? h(() => hostModel.stopTokens(ctx.model.name)) : []);
    this.stopSet = new Set(Array.from(stop as Iterable<number>));
  }
  /** Add a constraint (a Schema or Constraint, or a list), ANDed with those attached. */
  constrain(c: unknown): this {
    this.config++;
    if (this.rules === null) this.rules = new ConstraintSet(this.ctx.model);
    this.rules.add(c);
    return this;
  }
  /** Apply a LoRA adapter on every step (null = base weights). */
  adapter(a: { readonly handle: any } | null): this { this.config++; this.adapterOpt = a; return this; }
  /** Run every step with the adapter perturbed by zo seed `seed`. */
  zoSeed(seed: number): this { this.config++; this.zo = seed; return this; }
  maxTokens(n: number): this { this.config++; this.max = checkMax(n); return this; }
  stop(tokens: Iterable<number>): this { this.config++; this.stopSet = new Set(tokens); return this; }
  addStop(tokens: Iterable<number>): this { this.config++; for (const t of tokens) this.stopSet.add(t); return this; }
  /** Attach `probe` to input row `index` of every step (-1 = the sampled row). */
  probeEachStep(index: number, probe: Probe): ProbeHandle {
    this.config++;
    this.eachStep.push([index, probe]);
    return { row: this.eachStep.length - 1, kind: probe.spec(0).kind };
  }
  get tokensGenerated(): number { return this.accepted.length; }
  get isDone(): boolean { return this.done; }

  [Symbol.asyncIterator](): AsyncIterator<GenStep> {
    return { next: async () => (this.done ? { done: true, value: undefined } : { done: false, value: new GenStep(this) }) };
  }
  /** Register tokens picked by the caller; returns those accepted (cut before a stop token and at maxTokens). */
  accept(tokens: Iterable<number>): Uint32Array {
    const got: number[] = [];
    for (const t of tokens) {
      if (this.done) break;
      if (this.rules !== null) { // a token the constraints forbid ends the list
        if (!this.rules.admits(t)) break;
        this.rules.accept(t);
      }
      if (this.stopSet.has(t)) { this.done = true; break; }
      got.push(t);
      this.accepted.push(t);
      if (this.max !== undefined && this.accepted.length >= this.max) this.done = true;
      else if (this.rules !== null && this.rules.ended) this.done = true;
    }
    this.ctx.append(got);
    return Uint32Array.from(got);
  }
  /** @internal How many more steps like the next the engine may run ahead (0: none). */
  aheadRoom(): number {
    if (this.sampler.draws !== 1 || (this.rules !== null && !this.rules.isStatic)) return 0;
    if (this.max === undefined) return 2 ** 31 - 1;
    return Math.max(0, this.max - this.accepted.length - 1);
  }
  /** @internal The stop set, sorted. */
  stopList(): number[] { return Array.from(this.stopSet).sort((a, b) => a - b); }
  async collectTokens(): Promise<Uint32Array> {
    for await (const step of this) await step.execute();
    return Uint32Array.from(this.accepted);
  }
  async collectText(): Promise<string> {
    const tokens = await this.collectTokens();
    const dec = new Decoder(this.ctx.model);
    const parts: string[] = [];
    for (const t of tokens) {
      const ev = dec.feed([t]);
      if (ev.type === 'done') return ev.text;
      if (ev.type === 'delta') parts.push(ev.text);
    }
    return parts.join('');
  }
  /** Constrain to JSON (`schema`, or any JSON), run to the end, and parse the reply. */
  async collectJson<T = unknown>(opts: { schema?: string | object; parse?: (text: string) => T } = {}): Promise<T> {
    this.constrain(opts.schema === undefined ? anyJson() : jsonSchema(opts.schema));
    const text = await this.collectText();
    if (opts.parse) return opts.parse(text);
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new Error(`the reply is not complete JSON (${(e as Error).message}); generation stopped after `
        + `${this.accepted.length} tokens before the JSON ended: raise maxTokens`);
    }
  }
}

function checkMax(n: number | undefined): number | undefined {
  if (n !== undefined && (!Number.isInteger(n) || n < 0)) throw new RangeError(`maxTokens must be an integer >= 0, got ${n}`);
  return n;
}

/** One iteration of a generator: adjust it, then `await step.execute()`. */
export class GenStep {
  private sampleIt = true;
  private probes: [number, Probe][] = [];
  private executed = false;
  constructor(private readonly gen: Generator) {}
  clearSampler(): this { this.sampleIt = false; return this; }
  probe(index: number, p: Probe): ProbeHandle {
    this.probes.push([index, p]);
    return { row: this.gen.eachStep.length + this.probes.length - 1, kind: p.spec(0).kind };
  }
  async execute(): Promise<Output> {
    if (this.executed) throw new Error('step.execute() runs a step once; take the next step from the generator');
    this.executed = true;
    const gen = this.gen, kv = gen.ctx.kv, loop = gen.loop;
    const pending = gen.ctx.pendingTokens();
    if (loop !== null && this.sampleIt && this.probes.length === 0 && kv.epoch === loop.epoch && loop.config === gen.config
        && !gen.isDone && pending.length === 1 && pending[0] === loop.token) {
      // the decode loop goes on: the engine has usually run this pass already
      pending.length = 0;
      let raw: any;
      if (kv.ahead.length) {
        raw = kv.ahead.shift();
      } else {
        try {
          const got: any[] = await hostCall(h(() => inference.forwardNext(kv.handle)), (c) => h(() => inference.forwardNextResult(c)));
          raw = got[0];
          kv.ahead.push(...got.slice(1));
        } catch (e) {
          pending.push(loop.token);
          kv.epoch++;
          if (!kv.released) kv.length = h(() => hostContext.seqLen(kv.handle));
          throw e;
        }
      }
      kv.length += 1;
      return this.fold(new Output(raw), loop.handle, true);
    }
    gen.loop = null;
    const fwd = this.gen.ctx.forward(true).adapter(gen.adapterOpt).zoSeed(gen.zo);
    const n = fwd.size;
    if (n === 0) throw new Error('the generator has no token to run: append tokens or a prompt first');
    const row = (i: number) => (i < 0 ? n + i : i);
    const rules = this.gen.rules;
    if (rules !== null) await rules.ready();
    const mask = rules === null ? null : rules.mask();
    const hd = this.sampleIt ? fwd.sample([n - 1], this.gen.sampler, mask) : undefined;
    for (const [i, p] of [...this.gen.eachStep, ...this.probes]) fwd.probe(row(i), p);
    const ahead = hd !== undefined && this.probes.length === 0 && this.gen.eachStep.every(([i]) => i === -1)
      ? this.gen.aheadRoom() : 0;
    if (ahead > 0) fwd.runAhead(ahead, this.gen.stopList());
    const out = await fwd.execute();
    if (hd === undefined) return new Output(out.raw, new Uint32Array(), hd);
    return this.fold(out, hd, ahead > 0);
  }
  private fold(out: Output, hd: SampleHandle, looping: boolean): Output {
    const gen = this.gen;
    const run = out.tokensAt(hd);
    const tokens = gen.accept(run);
    gen.loop = looping && !gen.isDone && run.length === 1 && tokens.length === 1 && tokens[0] === run[0]
      ? { epoch: gen.ctx.kv.epoch, token: run[0], config: gen.config, handle: hd } : null;
    return new Output(out.raw, tokens, hd);
  }
}
