"""Host interface ``zo``: evolution strategies over an adapter's LoRA weights.

A pass with ``zo_seed=s`` (``inference.forward``) runs the adapter's mean plus ``sigma`` times
the seed's noise (:mod:`pie_core.backend_kit.lora`); :func:`update` applies the rule of
:mod:`pie_core.adapters.es`. Both calls return at once; the backend applies them before the
caller's next pass (``adapter.settled`` waits for that).
"""

from __future__ import annotations


from inferlet.host._declare import host
from inferlet.host.types import S64, Adapter

__all__ = ["initialize", "update"]


@host
def initialize(
    adapter: Adapter, rank: int, alpha: float, population_size: int, mu_fraction: float, initial_sigma: float
) -> None:
    """Reset ``adapter`` for zo training: rank ``rank`` over every projection, ``A`` drawn as
    ``zo_noise(INIT_SEED) / sqrt(in)``, ``B = 0`` (so the mean changes nothing yet), and
    ``sigma = initial_sigma``.

    Raises:
        InvalidInput: A value is out of range (population_size >= 2, 0 < mu_fraction <= 1,
            initial_sigma > 0, alpha finite).
        Unsupported: The backend does not run zo.
    """


@host
def update(adapter: Adapter, scores: list[float], seeds: list[S64], max_sigma: float) -> None:
    """Move the adapter's mean toward the better-scored candidates and adapt sigma (the rule is
    in :mod:`pie_core.adapters.es`); ``scores[i]`` is the score (higher is better) of the
    candidate that ran with ``zo_seed=seeds[i]``.

    Raises:
        InvalidInput: The adapter was not set up with :func:`initialize`, the lengths are not
            the population size, or a score, seed or ``max_sigma`` is invalid.
    """
