import type { ProbeSpec, SampleSpec, SamplerKind, ProbeKind } from 'pie:inferlet/types@0.1.0';

/** How a sampled row picks its token(s). */
export class Sampler {
  private constructor(readonly kind: SamplerKind, readonly temperature: number, readonly k = 0, readonly p = 1.0,
                      readonly minP = 0.0, readonly draws = 1, readonly seed = 0) {
    if (temperature < 0) throw new RangeError(`temperature must be >= 0, got ${temperature}`);
    if (draws < 1) throw new RangeError(`multinomial needs draws >= 1, got ${draws}`);
  }
  static argmax(): Sampler { return new Sampler('argmax', 0.0); }
  static topP(temperature = 0.6, p = 0.95, seed = 0): Sampler { return new Sampler('top-p', temperature, 0, p, 0, 1, seed); }
  static topK(temperature = 0.6, k = 40, seed = 0): Sampler { return new Sampler('top-k', temperature, k, 1.0, 0, 1, seed); }
  static minP(temperature = 0.6, p = 0.1, seed = 0): Sampler { return new Sampler('min-p', temperature, 0, 1.0, p, 1, seed); }
  static topKTopP(temperature = 0.6, k = 40, p = 0.95, seed = 0): Sampler {
    return new Sampler('top-k-top-p', temperature, k, p, 0, 1, seed);
  }
  static multinomial(temperature = 1.0, draws = 1, seed = 0): Sampler {
    return new Sampler('multinomial', temperature, 0, 1.0, 0, draws, seed);
  }
  /** The WIT `sample-spec` for input row `index`. */
  spec(index: number): SampleSpec {
    return { index, kind: this.kind, temperature: this.temperature, topK: this.k, topP: this.p, minP: this.minP,
             draws: this.draws, seed: this.seed, logitMask: null };
  }
}

export interface Probe { spec(index: number): ProbeSpec }

function probe(index: number, kind: ProbeKind, temperature = 1.0, k = 0, tokenIds: number[] = []): ProbeSpec {
  return { index, kind, temperature, k, tokenIds, maskedBy: -1 };
}

/** Raw logits of the row (float32 bytes). */
export function Logits(): Probe { return { spec: (i) => probe(i, 'logits') }; }
/** Top-`k` ids and probabilities of softmax(logits / temperature); k = 0: all. */
export function Distribution(temperature = 1.0, k = 0): Probe {
  if (temperature <= 0) throw new RangeError(`Distribution temperature must be > 0, got ${temperature}`);
  if (k < 0) throw new RangeError(`Distribution k must be >= 0, got ${k}`);
  return { spec: (i) => probe(i, 'distribution', temperature, k) };
}
/** The log-probability of one token. */
export function Logprob(token: number): Probe { return { spec: (i) => probe(i, 'logprobs', 1.0, 0, [token]) }; }
/** Log-probabilities of several tokens, in their order. */
export function Logprobs(tokens: Iterable<number>): Probe {
  const ids = Array.from(tokens);
  return { spec: (i) => probe(i, 'logprobs', 1.0, 0, ids) };
}
/** Shannon entropy (nats) of softmax(logits). */
export function Entropy(): Probe { return { spec: (i) => probe(i, 'entropy') }; }
