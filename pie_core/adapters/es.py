"""The zeroth-order update of an adapter: a rank-weighted evolution strategy over its LoRA weights.

A generation of candidates runs the adapter's mean weights ``m`` plus ``sigma * eps(s)`` for a
seed ``s`` each (``eps`` is :func:`pie_core.backend_kit.lora.zo_noise`); the inferlet scores them (higher is
better) and calls :func:`step`:

- **Selection and recombination** (a (mu/mu_w, lambda)-ES): the best ``mu = max(1,
  floor(mu_fraction * lambda))`` candidates, ranked, get weights ``w_j proportional to ln(mu +
  1/2) - ln(j)`` summing to 1, and the mean moves to their weighted centre:
  ``m <- m + sigma * sum_j w_j eps(s_j)``.
- **Step size** (a success rule): ``p`` is the share of this generation's candidates that score
  above the previous generation's median; ``sigma <- min(max_sigma, sigma * exp((p - 1/2) *
  2/3))`` -- it grows by up to 40% while candidates keep beating the last generation and
  shrinks by up to 28% when they do not. The first generation leaves sigma as it is.
- **No signal**: when every candidate scores the same, the mean stays and sigma grows by 40%
  (up to ``max_sigma``): the perturbations were too small to change the outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pie_core.errors import InvalidInput

__all__ = ["ZoState", "Step", "step"]

_GROWTH = 2.0 / 3.0


@dataclass(slots=True)
class ZoState:
    """What ``zo.initialize`` fixed and what the rule carries between generations."""

    population_size: int
    mu_fraction: float
    sigma: float
    last_median: float | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One update: move the mean by ``sum coefficients[i] * eps(seeds[i])``, then use ``sigma``."""

    seeds: np.ndarray  # int64
    coefficients: np.ndarray  # float32
    sigma: float
    median: float


def step(state: ZoState, scores: list[float], seeds: list[int], max_sigma: float) -> Step:
    """The update for one scored generation (``state`` is not changed; apply with the result).

    Raises:
        InvalidInput: Lengths differ or are 0, a score is not finite, a seed is 0 or not an
            int64, a seed repeats, or ``max_sigma`` is not a positive finite number.
    """
    if len(scores) != len(seeds) or not scores:
        raise InvalidInput(f"zo.update needs one score per seed; got {len(scores)} scores and {len(seeds)} seeds")
    if not isinstance(max_sigma, (int, float)) or not math.isfinite(max_sigma) or max_sigma <= 0:
        raise InvalidInput(f"max_sigma must be a positive number, got {max_sigma!r}")
    try:
        values = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInput("scores must be numbers") from None
    if values.ndim != 1 or not np.isfinite(values).all():
        raise InvalidInput("scores must be a list of finite numbers")
    if not all(isinstance(s, int) and s != 0 and -(1 << 63) <= s < (1 << 63) for s in seeds):
        raise InvalidInput("seeds must be nonzero 64-bit integers (the zo_seed of each candidate)")
    if len(set(seeds)) != len(seeds):
        raise InvalidInput("seeds must be distinct: each candidate has its own")
    median = float(np.median(values))
    sigma = state.sigma
    if values.max() == values.min():
        return Step(np.zeros(0, np.int64), np.zeros(0, np.float32), min(max_sigma, sigma * math.exp(_GROWTH / 2)), median)
    mu = max(1, math.floor(state.mu_fraction * len(values)))
    order = np.argsort(-values, kind="stable")[:mu]
    weights = math.log(mu + 0.5) - np.log(np.arange(1, mu + 1))
    weights /= weights.sum()
    if state.last_median is not None:
        success = float(np.mean(values > state.last_median))
        sigma = sigma * math.exp((success - 0.5) * _GROWTH)
    return Step(
        seeds=np.asarray([seeds[i] for i in order], dtype=np.int64),
        coefficients=(state.sigma * weights).astype(np.float32),
        sigma=min(max_sigma, sigma),
        median=median,
    )
