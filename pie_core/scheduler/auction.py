"""The KV-page auction: which bidders hold pages when they do not all fit, and at what price.

Each bidder asks for ``weight`` pages as one lot (a context is resident whole or not at all)
and offers ``bid`` credits per page per tick. The winners maximise the total offered,
``sum(bid * weight)``, within ``capacity`` pages: a 0/1 knapsack, solved exactly by dynamic
programming over page counts (in units of several pages when the pool is large, which only
rounds weights up). The clearing price is the highest bid that was excluded; a winner pays
``min(bid, price)`` per page, so no one pays more than it offered.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_CELLS", "knapsack", "clear"]

MAX_CELLS = 4096
"""Capacity units the dynamic program works over at most; larger pools count in groups of pages."""


def knapsack(weights: np.ndarray, values: np.ndarray, capacity: int) -> np.ndarray:
    """The 0/1 choice of items maximising the sum of ``values`` with ``sum(weights) <= capacity``.

    Items with value <= 0 are never chosen; among equal totals the choice is deterministic. One
    vectorised step per item: O(items x min(capacity, MAX_CELLS)).

    Returns:
        A bool mask over the items.
    """
    weights = np.asarray(weights, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    chosen = np.zeros(len(weights), dtype=bool)
    if capacity <= 0 or not len(weights):
        return chosen
    unit = -(-capacity // MAX_CELLS)
    cap = capacity // unit
    units = -(-weights // unit)
    best = np.zeros(cap + 1)
    took = np.zeros((len(weights), cap + 1), dtype=bool)
    for i, (w, v) in enumerate(zip(units.tolist(), values.tolist())):
        if v <= 0 or w > cap:
            continue
        with_item = best[: cap + 1 - w] + v
        better = with_item > best[w:]
        took[i, w:] = better
        best[w:] = np.where(better, with_item, best[w:])
    c = cap
    for i in range(len(weights) - 1, -1, -1):
        if took[i, c]:
            chosen[i] = True
            c -= units[i]
    return chosen


def clear(bids: np.ndarray, weights: np.ndarray, capacity: int, tiebreak: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Run the auction.

    Args:
        bids: Credits per page per tick each bidder offers (>= 0).
        weights: Pages each bidder needs (>= 1).
        capacity: Pages to hand out.
        tiebreak: Optional small preference per bidder (e.g. incumbency) that only decides
            between otherwise equal outcomes.

    Returns:
        The winners (bool mask) and the clearing price (0 when no bidder with a bid was left out).
    """
    bids = np.asarray(bids, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.int64)
    values = bids * weights
    if tiebreak is not None:
        values = values * (1.0 + 1e-9 * np.asarray(tiebreak, dtype=np.float64))
    winners = knapsack(weights, values, capacity)
    excluded = bids[~winners & (bids > 0)]
    return winners, float(excluded.max()) if excluded.size else 0.0
