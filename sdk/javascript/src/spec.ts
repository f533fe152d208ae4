// Speculative decoding: pass a Speculator to `ctx.generate(sampler, { speculator })`, or
// `systemSpeculation: true` for the runtime's own n-gram drafter (the two are exclusive). The
// drafts go into the step's forward pass, each with a sample row; the context keeps the longest
// run of drafts equal to what the sampler drew before them, plus the token drawn after that run:
// the tokens are exactly those generation without speculation gives, only several may come per
// step (`out.tokens`).
//
// Every step the generator calls `draft()` before the pass, when the step can carry drafts (not
// with probes, after `step.clearSampler()`, with a multi-draw sampler, with a custom Constraint,
// or when maxTokens leaves room for one token only); then `accept(tokens)` with the tokens the
// step produced; then `rollback(n)`, if present, when n of the drafted tokens were not kept.
// `reset()`, if present, is the speculator's own: the generator does not call it.

/** A drafter for speculative decoding (`draft` and `accept` are required). */
export interface Speculator {
  /** Draft tokens and their absolute positions for the next pass; `[[], []]` for none this
   * step. Positions continue the context: the first draft sits right after the step's input. */
  draft(): [ArrayLike<number>, ArrayLike<number>];
  /** The tokens the step produced: the input's own prediction first, then those that followed
   * the kept drafts. */
  accept(tokens: Uint32Array): void;
  /** Forget the last `n` drafted tokens: the verifier did not keep them. */
  rollback?(n: number): void;
  /** Back to the initial state. */
  reset?(): void;
}
