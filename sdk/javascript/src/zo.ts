// Zeroth-order training of an adapter: an evolution strategy over its LoRA weights
// (`import { zo } from 'inferlet'`, Python's `inferlet.zo`).
//
// The loop: `zo.initialize(adapter, ...)` once; then per generation run one candidate per seed
// with `ctx.generate(s, { adapter, zoSeed })` (the candidates batch together), score each
// (higher is better) and `zo.update(adapter, scores, seeds, maxSigma)`. A pass with zoSeed s
// runs the adapter's mean weights plus sigma times noise drawn from s; the update moves the mean
// toward the better candidates and adapts sigma. Without a seed the adapter runs its mean.
import hostZo from 'pie:inferlet/zo@0.1.0';
import { h } from './errors';
import { Adapter, Scheduled } from './extras';

/** Set `adapter` up for zo: fresh LoRA weights of `rank` on every projection (B = 0, so it
 * changes nothing yet), `alpha` scaling, `populationSize` candidates per generation, the best
 * `muFraction` of them to move toward (in (0, 1]), and the first perturbation scale. */
export function initialize(adapter: Adapter, rank: number, alpha: number, populationSize: number,
                           muFraction: number, initialSigma: number): Scheduled {
  h(() => hostZo.initialize(adapter.handle, rank, alpha, populationSize, muFraction, initialSigma));
  return adapter.settled();
}

/** Move `adapter` toward its better candidates: `scores[i]` (higher is better) ran with
 * `seeds[i]`; `maxSigma` bounds the adapted perturbation scale. */
export function update(adapter: Adapter, scores: Iterable<number>, seeds: Iterable<number>, maxSigma: number): Scheduled {
  h(() => hostZo.update(adapter.handle, Array.from(scores), Array.from(seeds), maxSigma));
  return adapter.settled();
}
