"""Zeroth-order training of an adapter: an evolution strategy over its LoRA weights.

The loop: ``zo.initialize(adapter, ...)`` once; then per generation run one candidate per seed
with ``ctx.generate(..., adapter=a, zo_seed=s)`` (the candidates batch together), score each
(higher is better) and call ``zo.update(adapter, scores, seeds, max_sigma)``. A pass with
``zo_seed=s`` runs the adapter's mean weights plus ``sigma`` times noise drawn from ``s``; the
update moves the mean toward the better candidates and adapts ``sigma`` (the rule is in
``docs/architecture.md``, "Adapters and zo"). Without a seed the adapter runs its mean.
"""

from __future__ import annotations

from inferlet.host import zo as _host
from inferlet.adapter import Adapter, Scheduled

__all__ = ["initialize", "update"]


def initialize(
    adapter: Adapter,
    rank: int,
    alpha: float,
    population_size: int,
    mu_fraction: float,
    initial_sigma: float,
) -> Scheduled:
    """Set ``adapter`` up for zo: fresh LoRA weights of ``rank`` on every projection (B = 0,
    so it changes nothing yet), ``alpha`` scaling, and the strategy's parameters.

    Args:
        adapter: The adapter to train (its weights are replaced).
        rank: LoRA rank.
        alpha: LoRA alpha (the delta is scaled by ``alpha / rank``).
        population_size: Candidates per generation (scores per ``update``).
        mu_fraction: Share of the best candidates the mean moves toward, in (0, 1].
        initial_sigma: The first perturbation scale.
    """
    _host.initialize(adapter._handle, rank, alpha, population_size, mu_fraction, initial_sigma)
    return Scheduled(adapter._handle)


def update(adapter: Adapter, scores: list[float], seeds: list[int], max_sigma: float) -> Scheduled:
    """Move ``adapter`` toward its better candidates.

    Args:
        adapter: An adapter set up with :func:`initialize`.
        scores: One score per candidate (higher is better), ``population_size`` of them.
        seeds: The ``zo_seed`` each candidate ran with, in the order of ``scores``.
        max_sigma: Upper bound on the adapted perturbation scale.
    """
    _host.update(adapter._handle, list(scores), list(seeds), max_sigma)
    return Scheduled(adapter._handle)
