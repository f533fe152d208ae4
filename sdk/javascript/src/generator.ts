import hostModel from 'pie:inferlet/model@0.1.0';
import inference from 'pie:inferlet/inference@0.1.0';
import hostContext from 'pie:inferlet/context@0.1.0';
import scheduling from 'pie:inferlet/scheduling@0.1.0';
import speculation from 'pie:inferlet/speculation@0.1.0';
import { hostCall } from './loop';
import { h } from './errors';
import { Kv, Output, ProbeHandle, SampleHandle, settled } from './forward';
import type { Context } from './context';
import type { Probe, Sampler } from './sampler';
import { Decoder } from './chat';
import { ConstraintSet, anyJson, jsonSchema } from './grammar';
import type { Speculator } from './spec';
import type { Adapter as HostAdapter, RequestOutput } from 'pie:inferlet/types@0.1.0';

/** Drafts verified per step (a speculator's further drafts count as not kept). */
const MAX_DRAFTS = 16;
/** The most the system drafter proposes per step. */
const SYSTEM_DRAFTS = 8;

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
  adapter?: { readonly handle: HostAdapter } | null;
  /** Evolution Strategies seed for every forward pass. */
  zoSeed?: number;
  /** The output length you expect: it feeds the KV-page market's default bid; unlike maxTokens
   * it never stops generation. */
  horizon?: number;
  /** A custom drafter (see `Speculator`); exclusive with systemSpeculation. */
  speculator?: Speculator;
  /** Draft with the runtime's n-gram drafter (prompt lookup over the context's tokens). */
  systemSpeculation?: boolean;
}

/** The decode loop of a context: each step runs the buffered tokens and samples the next token.
 * A stop token ends generation and is not accepted (nor counted, nor put in the context).
 *
 * The KV-page market hears from every step how many tokens the generator still expects
 * (`horizon` minus those accepted, or without a horizon or once past it `maxTokens` minus
 * them), and that it expects none once it ends: the context's default bid spreads over them. */
export class Generator implements AsyncIterable<GenStep> {
  private max: number | undefined;
  private stopSet: Set<number>;
  private accepted: number[] = [];
  private done = false;
  /** @internal */ eachStep: [number, Probe][] = [];
  /** @internal */ rules: ConstraintSet | null = null;
  /** @internal bumped whenever the steps' pass would change */ config = 0;
  /** @internal */ adapterOpt: { readonly handle: HostAdapter } | null = null;
  /** @internal */ zo = 0;
  /** @internal */ speculator: Speculator | null;
  /** @internal */ systemSpeculation: boolean;
  private expected: number | undefined;
  private told: Kv | null = null; // the context the market last heard this generator's horizon on
  private target: number | null = null; // the length it was told the context should reach
  /** @internal the decode loop the engine runs ahead of this generator */
  loop: { epoch: number; token: number; config: number; handle: SampleHandle } | null = null;

  constructor(/** @internal */ readonly ctx: Context, /** @internal */ readonly sampler: Sampler, options: GenerateOptions = {}) {
    if (options.speculator !== undefined && options.systemSpeculation) {
      throw new Error('speculator and systemSpeculation: true are mutually exclusive: pass one of them');
    }
    const spec = options.speculator;
    if (spec !== undefined && (typeof spec.draft !== 'function' || typeof spec.accept !== 'function')) {
      throw new TypeError('speculator needs draft() and accept() methods (the Speculator interface)');
    }
    this.speculator = spec ?? null;
    this.systemSpeculation = !!options.systemSpeculation;
    this.expected = checkHorizon(options.horizon);
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
  adapter(a: { readonly handle: HostAdapter } | null): this { this.config++; this.adapterOpt = a; return this; }
  /** Run every step with the adapter perturbed by zo seed `seed`. */
  zoSeed(seed: number): this { this.config++; this.zo = seed; return this; }
  /** Hint the expected output length (see the class doc); it never stops generation. */
  horizon(n: number): this { this.expected = checkHorizon(n); return this; }
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
  /** Register tokens picked by the caller; returns those accepted (cut before a stop token, at
   * maxTokens, and before a token the constraints forbid). */
  accept(tokens: Iterable<number>): Uint32Array {
    const got = this.fold(tokens);
    this.ctx.append(got);
    if (this.speculator !== null && got.length) this.speculator.accept(Uint32Array.from(got));
    return Uint32Array.from(got);
  }
  /** @internal Advance the generator over `tokens`; the ones accepted. */
  fold(tokens: Iterable<number>): number[] {
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
    if (this.done && this.told !== null) this.withdraw();
    return got;
  }
  /** Tokens it still expects (undefined: unknown). */
  private left(): number | undefined {
    const got = this.accepted.length;
    if (this.expected !== undefined && this.expected > got) return this.expected - got;
    return this.max === undefined ? undefined : Math.max(0, this.max - got);
  }
  /** @internal Tell the market what this step's context should grow to (the context's length
   * before the pass is `start`); only when that changes. */
  announce(kv: Kv, start: number): void {
    const left = this.left();
    const target = left === undefined ? null : start + left;
    if (kv !== this.told || target !== this.target) {
      h(() => scheduling.setHorizon(kv.handle, left ?? null));
      this.told = kv;
      this.target = target;
    }
  }
  private withdraw(): void {
    const kv = this.told!;
    this.told = null;
    this.target = null;
    if (!kv.released) h(() => scheduling.setHorizon(kv.handle, null));
  }
  /** @internal How many drafts the next step may verify (0: it runs without speculation). */
  draftRoom(): number {
    if (this.speculator === null && !this.systemSpeculation) return 0;
    if (this.sampler.draws !== 1 || this.eachStep.length) return 0;
    if (this.rules !== null && !this.rules.canSpeculate) return 0;
    const room = this.max === undefined ? MAX_DRAFTS : Math.min(MAX_DRAFTS, this.max - this.accepted.length - 1);
    return Math.max(0, room);
  }
  /** @internal The stop set. */
  get stopSetView(): Set<number> { return this.stopSet; }
  /** @internal How many more steps like the next the engine may run ahead (0: none). */
  aheadRoom(): number {
    if (this.speculator !== null || this.systemSpeculation || this.sampler.draws !== 1) return 0;
    if (this.rules !== null && !this.rules.isStatic) return 0;
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

function checkHorizon(n: number | undefined): number | undefined {
  if (n !== undefined && (!Number.isInteger(n) || n < 1)) throw new RangeError(`horizon (expected output tokens) must be an integer >= 1, got ${n}`);
  return n;
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
      gen.announce(kv, kv.length);
      pending.length = 0;
      let raw: RequestOutput;
      if (kv.ahead.length) {
        raw = kv.ahead.shift()!;
      } else {
        try {
          const got = await hostCall(h(() => inference.forwardNext(kv.handle)), (c) => h(() => inference.forwardNextResult(c)));
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
      return this.fold(new Output(raw), loop.handle, true, [], []);
    }
    gen.loop = null;
    const rules = this.gen.rules;
    if (rules !== null) await rules.ready(); // compile and mask first: a dead end runs nothing
    const mask = rules === null ? null : rules.mask();
    const n = pending.length;
    if (n === 0) throw new Error('the generator has no token to run: append tokens or a prompt first');
    const row = (i: number) => (i < 0 ? n + i : i);
    gen.announce(kv, kv.length);
    // drafts before the pass takes the buffer: a speculator sees the step's input in ctx.buffer()
    const room = this.sampleIt && this.probes.length === 0 ? gen.draftRoom() : 0;
    const [drafted, drafts, masks] = room ? this.drafts(kv, pending, room) : [[], [], [mask]];
    const fwd = this.gen.ctx.forward(true).adapter(gen.adapterOpt).zoSeed(gen.zo);
    for (const [i, p] of [...this.gen.eachStep, ...this.probes]) fwd.probe(row(i), p);
    let hd: SampleHandle | undefined;
    if (this.sampleIt) {
      fwd.draft(drafts);
      const rows = masks.map((m, i) => fwd.sample([n - 1 + i], gen.sampler, m));
      hd = rows.length === 1 ? rows[0] : { rows: rows.map((r) => r.rows[0]) };
    }
    const ahead = hd !== undefined && !drafts.length && this.probes.length === 0 && this.gen.eachStep.every(([i]) => i === -1)
      ? this.gen.aheadRoom() : 0;
    if (ahead > 0) fwd.runAhead(ahead, this.gen.stopList());
    const out = await fwd.execute();
    if (hd === undefined) return new Output(out.raw, new Uint32Array(), hd);
    return this.fold(out, hd, ahead > 0, drafted, drafts);
  }
  /** Fold the step's sampled tokens into the generator (`drafted`: what the drafter proposed,
   * `drafts`: what the pass verified). */
  private fold(out: Output, hd: SampleHandle, looping: boolean, drafted: number[], drafts: number[]): Output {
    const gen = this.gen;
    const kept = out.raw.draftsKept;
    const run = drafts.length ? hd.rows.slice(0, kept + 1).map((r) => out.raw.tokens[r][0]) : Array.from(out.tokensAt(hd));
    const tokens = gen.fold(run);
    gen.loop = looping && !gen.isDone && run.length === 1 && tokens.length === 1 && tokens[0] === run[0]
      ? { epoch: gen.ctx.kv.epoch, token: run[0], config: gen.config, handle: hd } : null;
    if (tokens.length < kept) throw new Error(`generator bug: ${kept} drafts kept in the KV but ${tokens.length} tokens accepted`);
    gen.ctx.append(tokens.slice(kept)); // the kept drafts are in the KV already; the rest waits in the buffer
    const spec = gen.speculator;
    if (spec !== null) {
      if (tokens.length) spec.accept(Uint32Array.from(tokens));
      const rejected = drafted.length - kept; // also when the step sampled only the stop token
      if (rejected > 0 && typeof spec.rollback === 'function') spec.rollback(rejected);
    }
    return new Output(out.raw, Uint32Array.from(tokens), hd);
  }
  /** The step's drafts: what the drafter proposed, the usable prefix, and the mask for the row
   * before each usable draft and after the last. */
  private drafts(kv: Kv, pending: number[], room: number): [number[], number[], (Uint8Array | null)[]] {
    const gen = this.gen;
    let drafted: number[];
    if (gen.speculator !== null) {
      const [tokens, positions] = gen.speculator.draft();
      drafted = Array.from(tokens);
      const at = Array.from(positions), start = kv.length + pending.length;
      if (at.length !== drafted.length || at.some((p, i) => p !== start + i)) {
        throw new Error(`speculator.draft() must return one position per token, continuing the context from ${start}; `
          + `got tokens ${drafted.slice(0, 8)} at positions ${at.slice(0, 8)}`);
      }
    } else {
      drafted = h(() => speculation.systemDraft(settled(kv), pending, Math.min(room, SYSTEM_DRAFTS)));
    }
    let drafts = drafted.slice(0, room);
    let masks: (Uint8Array | null)[];
    if (gen.rules !== null) {
      masks = gen.rules.masksAlong(drafts, gen.stopSetView);
      drafts = drafts.slice(0, masks.length - 1);
    } else { // a stop token can only end a step, never sit in the KV as a kept draft
      const cut = drafts.findIndex((t) => gen.stopSetView.has(t));
      if (cut >= 0) drafts = drafts.slice(0, cut);
      masks = new Array(drafts.length + 1).fill(null);
    }
    return [drafted, drafts, masks];
  }
}
