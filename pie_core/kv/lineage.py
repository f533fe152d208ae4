"""What a context's KV was computed from, pass by pass, so it can be computed again.

A suspended context whose pages were dropped is rebuilt by replaying its lineage: the tokens
and positions (kept by :class:`~pie_core.kv.context.KvContext`) plus, per run of slots, the
attention mask the pass used and the tag of what it ran under besides the base weights (an
adapter and zo seed; opaque here). Causal runs with equal tags merge; each masked pass stays
its own run, since its mask rows span exactly the slots up to its end.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

import numpy as np

__all__ = ["Run", "Lineage"]


class Run(NamedTuple):
    """Slots ``[start, stop)``: ``masks`` None (causal) or packed bool rows over ``stop`` slots.

    A named tuple rather than a frozen dataclass: a decode step makes one (the causal run it
    extends), and a tuple is made in a third of the time.
    """

    start: int
    stop: int
    tag: Any = None
    masks: np.ndarray | None = None

    def mask_rows(self) -> np.ndarray | None:
        if self.masks is None:
            return None
        return np.unpackbits(self.masks, axis=1, count=self.stop).astype(bool)


class Lineage:
    """Runs covering slots ``[0, length)`` in order. ``replayable`` turns False for good when a
    truncation cuts a masked pass (its kept rows attended to the dropped ones)."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self.replayable = True

    @property
    def length(self) -> int:
        return self.runs[-1].stop if self.runs else 0

    def extend(self, n: int, tag: Any = None, masks: np.ndarray | None = None) -> None:
        """Record a pass of ``n`` tokens (``masks``: its bool rows [n, length + n], or None)."""
        start = self.length
        if masks is not None:
            self.runs.append(Run(start, start + n, tag, np.packbits(masks, axis=1)))
        elif self.runs and self.runs[-1].masks is None and self.runs[-1].tag == tag:
            self.runs[-1] = Run(self.runs[-1].start, start + n, tag)
        else:
            self.runs.append(Run(start, start + n, tag))

    def truncate(self, length: int) -> None:
        """Forget slots from ``length`` on."""
        while self.runs and self.runs[-1].start >= length:
            self.runs.pop()
        if self.runs and self.runs[-1].stop > length:
            last = self.runs.pop()
            if last.masks is not None:
                self.replayable = False
            self.runs.append(Run(last.start, length, last.tag))

    def copy(self) -> Lineage:
        other = Lineage()
        other.runs = list(self.runs)
        other.replayable = self.replayable
        return other

    def tags(self) -> set[Any]:
        return {r.tag for r in self.runs}

    def chunks(self, start: int, max_tokens: int) -> Iterator[Run]:
        """The passes that recompute slots ``[start, length)``: causal runs cut into pieces of at
        most ``max_tokens``, masked runs whole (they must start at or after ``start``)."""
        for run in self.runs:
            if run.stop <= start:
                continue
            if run.masks is not None:
                if run.start < start:
                    raise ValueError("a replay cannot start inside a masked pass")
                yield run
                continue
            for lo in range(max(run.start, start), run.stop, max_tokens):
                yield Run(lo, min(run.stop, lo + max_tokens), run.tag)
