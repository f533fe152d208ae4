"""Where a new inferlet runs: the replica of a model that scores best for what it will need.

The score, compared in this order (docs/architecture.md, "Data-parallel replicas"):

1. free pages: replicas whose pool (free plus idle cached pages) covers the expected pages come
   first; among those that do not, the one with the most free pages;
2. cached prefix: the longest run of the prompt's chained page hashes found in the replica's
   prefix cache (the same keys ``KvContext`` commits under, so there is no second index);
3. load: inferlets bound to the replica, plus its queued and in-flight passes (fewer is better).

Ties go to the lowest index. Dead replicas are skipped while a live one is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pie_core.kv.prefix_cache import chain_keys, salted_root

if TYPE_CHECKING:
    from pie_core.engine.engine import LoadedModel

__all__ = ["Demand", "place", "prompt_keys", "score"]


@dataclass(frozen=True, slots=True)
class Demand:
    """What a new inferlet is expected to need on the replica it is placed on.

    Attributes:
        pages: KV pages it is expected to hold (prompt plus reply); 1 when it says nothing.
        keys: The chained hashes of its prompt's full pages (:func:`prompt_keys`); empty when
            the prompt is not known.
    """

    pages: int = 1
    keys: tuple[bytes, ...] = field(default=())


def prompt_keys(tokens: Sequence[int], page_size: int) -> tuple[bytes, ...]:
    """The chained hashes of the full pages of a prompt that starts a context (positions from
    0, base weights), as a context computing it would commit them."""
    whole = len(tokens) // page_size * page_size
    if not whole:
        return ()
    ids = np.asarray(tokens[:whole], dtype=np.int32)
    return tuple(chain_keys(salted_root(b""), ids, np.arange(whole, dtype=np.int32), page_size))


def score(replica: LoadedModel, demand: Demand) -> tuple[int, int, int, int]:
    """The replica's score for ``demand``: greater is better (see the module docstring)."""
    free = replica.pool.available_count
    covers = free >= demand.pages
    hit = replica.pool.cache.cached_prefix(list(demand.keys)) if demand.keys else 0
    return (int(covers), 0 if covers else free, hit, -replica.load)


def place(replicas: Sequence[LoadedModel], demand: Demand) -> LoadedModel:
    """The replica ``demand`` is placed on: the best score among the live replicas (among all
    when none is alive, so the caller sees the dead replica's error)."""
    if not replicas:
        raise ValueError("place needs at least one replica")
    live = [r for r in replicas if r.alive] or list(replicas)
    best = live[0]
    best_score = score(best, demand)
    for replica in live[1:]:
        s = score(replica, demand)
        if s > best_score:
            best, best_score = replica, s
    return best
