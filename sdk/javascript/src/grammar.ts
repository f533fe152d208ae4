import hostGrammar from 'pie:inferlet/grammar@0.1.0';
import type { Matcher as MatcherHandle } from 'pie:inferlet/types@0.1.0';
import { h } from './errors';
import { hostCall, PiePromise } from './loop';
import { Model, Tokenizer } from './model';

interface Source { kind: string; text: string; whitespace: boolean }

const schemaText = (s: string | object | boolean) => (typeof s === 'string' ? s : JSON.stringify(s));

/** A grammar as text; compiled for a model by a Matcher. */
export class Grammar {
  private constructor(/** @internal */ readonly source: Source) {}
  /** JSON conforming to a JSON Schema (text or object). */
  static fromJsonSchema(schema: string | object | boolean, whitespace = false): Grammar {
    return new Grammar(h(() => hostGrammar.jsonSchema(schemaText(schema), whitespace)));
  }
  /** Any JSON value. */
  static json(whitespace = false): Grammar { return new Grammar(h(() => hostGrammar.anyJson(whitespace))); }
  /** Strings that match `pattern` in full. */
  static fromRegex(pattern: string): Grammar { return new Grammar(h(() => hostGrammar.regex(pattern))); }
  /** A GBNF or Lark grammar. */
  static fromEbnf(text: string): Grammar { return new Grammar(h(() => hostGrammar.ebnf(text))); }
  /** @internal A grammar the host made (a tool-call grammar). */
  static fromSource(source: Source): Grammar { return new Grammar(source); }
  get kind(): string { return this.source.kind; }
  get text(): string { return this.source.text; }
  buildConstraint(model: Model): GrammarConstraint { return GrammarConstraint.fromGrammar(this, model); }
}

/** A stateful walker of a grammar over one model's vocabulary; compilation starts at once. */
export class Matcher {
  /** @internal */ readonly handle: MatcherHandle;
  readonly modelName: string;
  constructor(readonly grammar: Grammar, tokenizer: Tokenizer | Model, compileTimeout: number | null = null) {
    this.modelName = tokenizer.name;
    this.handle = h(() => hostGrammar.matcher(tokenizer.name, grammar.source, compileTimeout));
  }
  /** Wait until the grammar is compiled (throws invalid-input if it does not compile). */
  ready(): PiePromise<void> {
    if (h(() => hostGrammar.matcherIsReady(this.handle))) return PiePromise.resolve();
    return hostCall(h(() => hostGrammar.matcherReady(this.handle)), (c) => { h(() => hostGrammar.matcherReadyResult(c)); });
  }
  acceptTokens(ids: Iterable<number>): void { h(() => hostGrammar.matcherAccept(this.handle, Array.from(ids))); }
  tryAccept(token: number): boolean { return h(() => hostGrammar.matcherTryAccept(this.handle, token)); }
  rollback(n: number): void { h(() => hostGrammar.matcherRollback(this.handle, n)); }
  /** The tokens allowed next as BRLE runs. */
  nextTokenLogitMask(): Uint32Array { return Uint32Array.from(h(() => hostGrammar.matcherRuns(this.handle))); }
  /** The tokens allowed next, packed 8 per byte (little bit order). */
  packedMask(): Uint8Array { return Uint8Array.from(h(() => hostGrammar.matcherPacked(this.handle))); }
  isTerminated(): boolean { return h(() => hostGrammar.matcherIsTerminated(this.handle)); }
  isCompleted(): boolean { return h(() => hostGrammar.matcherCanEnd(this.handle)); }
  reset(): void { h(() => hostGrammar.matcherReset(this.handle)); }
}

/** A constraint that holds generation to a grammar. */
export class GrammarConstraint {
  private fed = 0;
  constructor(readonly matcher: Matcher) {}
  get modelName(): string { return this.matcher.modelName; }
  static fromGrammar(g: Grammar, model: Model): GrammarConstraint { return new GrammarConstraint(new Matcher(g, model)); }
  static fromJsonSchema(s: string | object, model: Model): GrammarConstraint { return GrammarConstraint.fromGrammar(Grammar.fromJsonSchema(s), model); }
  static json(model: Model): GrammarConstraint { return GrammarConstraint.fromGrammar(Grammar.json(), model); }
  static fromRegex(p: string, model: Model): GrammarConstraint { return GrammarConstraint.fromGrammar(Grammar.fromRegex(p), model); }
  static fromEbnf(g: string, model: Model): GrammarConstraint { return GrammarConstraint.fromGrammar(Grammar.fromEbnf(g), model); }
  /** The Constraint protocol, for use outside a generator: accept, then the next mask as BRLE. */
  step(accepted: Uint32Array | number[]): Uint32Array {
    if (accepted.length) this.matcher.acceptTokens(accepted);
    this.fed += accepted.length;
    return this.matcher.nextTokenLogitMask();
  }
}

/** Something that builds a constraint for a model. */
export interface Schema { buildConstraint(model: Model): GrammarConstraint | Constraint }
/** A stateful constraint: the BRLE mask of the next token, given the tokens accepted since the last call. */
export interface Constraint { step(accepted: Uint32Array): Uint32Array }

export const anyJson = (whitespace = false): Schema => ({ buildConstraint: (m) => GrammarConstraint.fromGrammar(Grammar.json(whitespace), m) });
export const jsonSchema = (s: string | object | boolean, whitespace = false): Schema => {
  const g = Grammar.fromJsonSchema(s, whitespace); // a malformed schema fails here
  return { buildConstraint: (m) => GrammarConstraint.fromGrammar(g, m) };
};
export const regex = (p: string): Schema => { const g = Grammar.fromRegex(p); return { buildConstraint: (m) => GrammarConstraint.fromGrammar(g, m) }; };
export const ebnf = (text: string): Schema => { const g = Grammar.fromEbnf(text); return { buildConstraint: (m) => GrammarConstraint.fromGrammar(g, m) }; };
export const grammar = (g: Grammar): Schema => ({ buildConstraint: (m) => GrammarConstraint.fromGrammar(g, m) });

/** The constraints of one generator, ANDed: grammars advance as tokens are accepted; other
 * constraints step lazily with the tokens accepted since. Masks are packed bytes. */
export class ConstraintSet {
  private grammars: GrammarConstraint[] = [];
  private others: Constraint[] = [];
  private pending: number[] = [];
  private cached: Uint8Array | null | undefined = undefined;
  private accepted = 0;
  private readonly staticMask: Uint8Array | null;
  constructor(private readonly model: Model, staticRuns?: number[]) {
    h(() => hostGrammar.checkMasks(model.name));
    this.staticMask = staticRuns === undefined ? null : Uint8Array.from(h(() => hostGrammar.packedMask(model.name, staticRuns)));
  }
  /** Only the static mask: the engine may run steps ahead. */
  get isStatic(): boolean { return this.grammars.length === 0 && this.others.length === 0; }
  add(item: unknown): void {
    if (Array.isArray(item)) { for (const each of item) this.add(each); return; }
    const it = item as any;
    if (it instanceof GrammarConstraint) {
      if (it.modelName !== this.model.name) throw new Error(`this constraint was built for model ${it.modelName}, the generator runs on ${this.model.name}`);
      this.grammars.push(it);
    } else if (it && typeof it.buildConstraint === 'function') {
      this.add(it.buildConstraint(this.model));
      return;
    } else if (it && typeof it.step === 'function') {
      this.others.push(it);
    } else {
      throw new TypeError('constrain takes a Schema (buildConstraint(model)) or a Constraint (step(accepted))');
    }
    this.cached = undefined;
  }
  /** Whether masks can be computed ahead over drafts: grammars roll back, a custom
   * Constraint's `step` cannot be undone. */
  get canSpeculate(): boolean { return this.others.length === 0; }
  get ended(): boolean { return this.grammars.some((g) => g.matcher.isTerminated()); }
  /** The masks for the next token and after each draft in turn, as far as the drafts can go
   * (`1 + usable` masks); the constraints end where they started. Drafts stop before one the
   * constraints forbid, one in `stop`, or one that ends a grammar (such a token can only be
   * the last of a step). Only when `canSpeculate`. */
  masksAlong(drafts: number[], stop: Set<number>): (Uint8Array | null)[] {
    const first = this.mask();
    const masks = [first];
    let walked = 0;
    try {
      for (const t of drafts) {
        if (stop.has(t) || !this.admits(t)) break;
        for (const g of this.grammars) g.matcher.tryAccept(t);
        walked++;
        this.cached = undefined;
        if (this.ended) break;
        try {
          masks.push(this.mask());
        } catch {
          break; // a dead end after this draft: the step stops before it
        }
      }
    } finally {
      for (const g of this.grammars) g.matcher.rollback(walked);
      this.cached = first;
    }
    return masks;
  }
  async ready(): Promise<void> { for (const g of this.grammars) await g.matcher.ready(); }
  mask(): Uint8Array | null {
    if (this.cached !== undefined) return this.cached;
    const masks = this.grammars.map((g) => g.matcher.packedMask());
    const pending = this.pending;
    this.pending = [];
    for (const c of this.others) {
      const runs = c.step(Uint32Array.from(pending));
      if (runs.length) masks.push(Uint8Array.from(h(() => hostGrammar.packedMask(this.model.name, Array.from(runs)))));
    }
    if (this.staticMask !== null) masks.push(this.staticMask);
    let mask: Uint8Array | null = null;
    for (const m of masks) mask = mask === null ? m : mask.map((b, i) => b & m[i]);
    if (mask !== null && mask.every((b) => b === 0)) {
      throw new Error(`the generator's constraints allow no token after ${this.accepted} accepted tokens: loosen one of them`);
    }
    this.cached = mask;
    return mask;
  }
  admits(token: number): boolean {
    const m = this.mask();
    return m === null || (token >= 0 && token < m.length * 8 && ((m[token >> 3] >> (token & 7)) & 1) === 1);
  }
  accept(token: number): void {
    this.grammars.forEach((g, i) => {
      if (!g.matcher.tryAccept(token)) {
        for (const done of this.grammars.slice(0, i)) done.matcher.rollback(1);
        throw new Error(`token ${token} is not allowed by the grammar`);
      }
    });
    this.pending.push(token);
    this.accepted++;
    this.cached = undefined;
  }
}
