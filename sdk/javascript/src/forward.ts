import inference from 'pie:inferlet/inference@0.1.0';
import context from 'pie:inferlet/context@0.1.0';
import speculation from 'pie:inferlet/speculation@0.1.0';
import { h } from './errors';
import { hostCall, PiePromise } from './loop';
import type { Probe, Sampler } from './sampler';
import type { Adapter as HostAdapter, Context as HostContext, ProbeSpec, ProbeValue, RequestOutput, SampleSpec } from 'pie:inferlet/types@0.1.0';

export interface SampleHandle { readonly rows: number[] }

/** The most drafts one pass verifies. */
export const DRAFTS_PER_PASS = 64;
export interface ProbeHandle { readonly row: number; readonly kind: string }

/** What the SDK knows of a context's KV cache: its handle, its length as the SDK changed it, an
 * epoch bumped by every pass and change, and passes of a decode loop the engine ran ahead
 * (`inference.forward-next`) taken but not handed out yet. */
export interface Kv { handle: HostContext; length: number; released: boolean; epoch: number; ahead: RequestOutput[] }

/** The handle holding exactly `kv.length` tokens: passes the engine ran ahead that were never
 * handed out are truncated first (their decode loop ends). */
export function settled(kv: Kv): HostContext {
  if (kv.released) throw new Error('this context was released; create a new Context');
  if (kv.ahead.length) {
    const n = kv.ahead.length;
    kv.ahead = [];
    kv.epoch++;
    h(() => context.truncate(kv.handle, n));
  }
  return kv.handle;
}

/** A forward pass's results. */
export class Output {
  /** `raw`: the pass's WIT `request-output` (tokens per sample row, values per probe, drafts kept). */
  constructor(readonly raw: RequestOutput,
              readonly tokens: Uint32Array = new Uint32Array(), readonly autoSampler?: SampleHandle) {}
  token(hd: SampleHandle): number | undefined {
    return hd.rows.length === 1 && hd.rows[0] < this.raw.tokens.length ? this.raw.tokens[hd.rows[0]][0] : undefined;
  }
  tokensAt(hd: SampleHandle): Uint32Array {
    return Uint32Array.from(hd.rows.flatMap((r) => this.raw.tokens[r] ?? []));
  }
  private probeValue<K extends ProbeValue['tag']>(hd: ProbeHandle, kind: K): Extract<ProbeValue, { tag: K }>['val'] | undefined {
    const p = this.raw.probes[hd.row];
    return p !== undefined && p.tag === kind && hd.kind === kind ? (p as Extract<ProbeValue, { tag: K }>).val as any : undefined;
  }
  distribution(hd: ProbeHandle): [Uint32Array, Float32Array] | undefined {
    const v = this.probeValue(hd, 'distribution');
    return v === undefined ? undefined : [Uint32Array.from(v[0]), Float32Array.from(v[1])];
  }
  logits(hd: ProbeHandle): Uint8Array | undefined {
    const v = this.probeValue(hd, 'logits');
    return v === undefined ? undefined : Uint8Array.from(v);
  }
  logprobs(hd: ProbeHandle): Float32Array | undefined {
    const v = this.probeValue(hd, 'logprobs');
    return v === undefined ? undefined : Float32Array.from(v);
  }
  entropy(hd: ProbeHandle): number | undefined { return this.probeValue(hd, 'entropy'); }
}

/** One forward pass on a context; nothing runs until `execute`. */
export class Forward {
  private tokens: number[] = [];
  private positions: number[] = [];
  private masks: number[][] | null = null;
  private logitMask: number[] | null = null;
  private samples: SampleSpec[] = [];
  private probes: ProbeSpec[] = [];
  private adapterHandle: HostAdapter | null = null;
  private zo = 0;
  private ahead = 0;
  private drafts = 0;
  private stopTokens: number[] = [];
  private readonly start: number;

  /** @internal use `ctx.forward()` */
  constructor(private readonly kv: Kv, private readonly flushed: number[] = [], private readonly onFail?: () => void) {
    if (kv.released) throw new Error('this context was released; create a new Context');
    this.start = kv.length;
    this.input(flushed);
  }
  startPosition(): number { return this.start; }
  /** Input rows so far. */
  get size(): number { return this.tokens.length; }
  input(tokens: Iterable<number>): this {
    this.noDraftsYet('input');
    const base = this.start + this.tokens.length;
    const list = Array.from(tokens);
    for (let i = 0; i < list.length; i++) { this.tokens.push(list[i]); this.positions.push(base + i); }
    return this;
  }
  inputAt(tokens: Iterable<number>, positions: Iterable<number>): this {
    const t = Array.from(tokens), p = Array.from(positions);
    if (t.length !== p.length) throw new RangeError(`inputAt got ${t.length} tokens and ${p.length} positions`);
    this.noDraftsYet('inputAt');
    this.tokens.push(...t);
    this.positions.push(...p);
    return this;
  }
  /** Add speculative draft tokens after the inputs, positions continuing. The pass verifies
   * them in one go: sample the row before each draft and the last draft
   * (`fwd.sample(range(n - 1, n + k), sampler)` for n inputs and k drafts). The context keeps
   * the longest run of drafts each equal to the token sampled at the row before it and drops the
   * rest; `out.raw.draftsKept` says how many. At most DRAFTS_PER_PASS (64) drafts a pass. */
  draft(tokens: Iterable<number>): this {
    const list = Array.from(tokens);
    if (this.drafts + list.length > DRAFTS_PER_PASS) {
      throw new RangeError(`a pass verifies at most ${DRAFTS_PER_PASS} drafts (DRAFTS_PER_PASS), got `
        + `${this.drafts + list.length}: draft fewer tokens per step`);
    }
    const base = this.start + this.tokens.length;
    list.forEach((t, i) => { this.tokens.push(t); this.positions.push(base + i); });
    this.drafts += list.length;
    return this;
  }
  /** Up to `limit` (at most 8) tokens the runtime's n-gram drafter expects after this pass's
   * inputs, from the context's own tokens; often none. For `draft`. */
  systemDrafts(limit: number): number[] {
    return h(() => speculation.systemDraft(settled(this.kv), this.tokens, limit));
  }
  private noDraftsYet(what: string): void {
    if (this.drafts) throw new Error(`fwd.${what}() after fwd.draft(): drafts come after every other input`);
  }
  attentionMask(masks: Iterable<Iterable<number>>): this { this.masks = Array.from(masks, (m) => Array.from(m)); return this; }
  mask(brle: Iterable<number>): this { this.logitMask = Array.from(brle); return this; }
  adapter(a: { readonly handle: HostAdapter } | null): this { this.adapterHandle = a === null ? null : a.handle; return this; }
  zoSeed(seed: number): this { this.zo = seed; return this; }
  /** Sample input rows `indices`; `mask` (packed, 8 tokens a byte) limits them to its tokens. */
  sample(indices: Iterable<number> | number, sampler: Sampler, mask: Uint8Array | null = null): SampleHandle {
    const rows: number[] = [];
    for (const i of typeof indices === 'number' ? [indices] : indices) {
      rows.push(this.samples.length);
      const spec = sampler.spec(i);
      if (mask !== null) spec.logitMask = mask;
      this.samples.push(spec);
    }
    return { rows };
  }
  probe(index: number, p: Probe): ProbeHandle {
    const spec = p.spec(index);
    this.probes.push(spec);
    return { row: this.probes.length - 1, kind: spec.kind };
  }
  /** @internal Let the engine run `ahead` more passes like this one, each on the token sampled
   * before it, unless that token is in `stop` (the generator's decode loop). */
  runAhead(ahead: number, stop: number[]): void { this.ahead = ahead; this.stopTokens = stop; }
  /** Run the pass. */
  execute(): PiePromise<Output> {
    const kv = this.kv;
    const handle = settled(kv);
    kv.epoch++;
    const call = h(() => inference.forward(handle, this.tokens, this.positions, this.masks, this.logitMask,
      this.samples, this.probes, this.drafts, this.adapterHandle, this.zo, this.ahead, this.stopTokens));
    const n = this.tokens.length - this.drafts;
    return hostCall(call, (c) => h(() => inference.forwardResult(c))).then((raw) => {
      kv.length += n + raw.draftsKept;
      return new Output(raw);
    }, (e) => { if (this.onFail) this.onFail(); throw e; });
  }
}
