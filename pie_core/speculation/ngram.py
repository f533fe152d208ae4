"""The system drafter: prompt lookup over a context's own tokens, with an adaptive length.

A context's text often repeats itself (code being rewritten, a passage being quoted), so the
tokens that followed the latest earlier occurrence of its last few tokens are a good guess at
what comes next. :class:`NgramDrafter` keeps an index from each n-gram (``MIN_NGRAM`` to
``MAX_NGRAM`` tokens, over the last ``WINDOW`` tokens) to where its latest occurrence
continues, updated as the context grows, and proposes up to ``length`` tokens from the longest n-gram that matches.

The length adapts to how many of its drafts were kept (it scores each proposal against the
tokens the context holds at the next call): +2 after a proposal kept whole, -1 otherwise
(at least 1). When the kept share (an exponential average, starting at one half) falls below
the bar, it proposes nothing for a while, and for twice as long after each further poor
proposal (up to ``MAX_PAUSE`` steps), so text that does not repeat costs next to nothing.

The bar rises with the model's load (``load``: requests in its last batch). Alone on the
model a draft row costs a fraction of a step (the weights are read once for all rows), so a
kept share of ``LOW`` pays; in a full batch every row costs compute that other requests wait
for, so only text that repeats reliably (``BUSY_LOW`` from ``BUSY`` requests up) is drafted.

Drafts never change what is generated (the verifier keeps only drafts equal to what the model
samples), so a stale or wrong guess costs time, never correctness.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["NgramDrafter"]

MIN_NGRAM = 2
MAX_NGRAM = 4
START_LENGTH = 4
MAX_LENGTH = 8
LOW = 0.3
BUSY = 4
BUSY_LOW = 0.7
MAX_PAUSE = 32
WINDOW = 16384  # the index covers at most the last WINDOW tokens (bounded memory per context)
_DECAY = 0.5


class NgramDrafter:
    """Prompt-lookup drafts for one context (see the module docstring)."""

    def __init__(self, max_length: int = MAX_LENGTH) -> None:
        self.max_length = max_length
        self.length = min(START_LENGTH, max_length)
        self.kept_share = 0.5  # exponential average of kept / proposed
        self.proposed = 0  # drafts proposed in all
        self.kept = 0  # of which the context kept
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(MIN_NGRAM, MAX_NGRAM + 1)}
        self._indexed = 0  # n-grams ending before this position are indexed
        self._last: tuple[int, list[int]] | None = None  # (position, drafts) of the last proposal
        self._pause = 0  # proposals still to sit out
        self._next_pause = 1

    def propose(self, history: Sequence[int], limit: int, load: int = 1) -> list[int]:
        """Up to ``limit`` tokens likely to follow ``history`` (the context's tokens so far,
        including those about to run); ``[]`` when nothing matches or drafting pauses.
        ``load`` is the number of requests in the model's last batch."""
        self._score(history, BUSY_LOW if load >= BUSY else LOW)
        self._extend_index(history)
        if limit <= 0 or self._pause > 0:
            self._pause = max(0, self._pause - 1)
            return []
        drafts = self._lookup(history, min(limit, self.length))
        if drafts:
            self._last = (len(history), drafts)
        return drafts

    def _lookup(self, history: Sequence[int], limit: int) -> list[int]:
        end = len(history)
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if end <= n:
                continue
            key = tuple(history[end - n :])
            at = self._index[n].get(key)
            if at is not None and at < end and tuple(history[at - n : at]) == key:
                return [int(t) for t in history[at : at + limit]]
        return []

    def _extend_index(self, history: Sequence[int]) -> None:
        end = len(history)
        full = any(len(table) > 2 * WINDOW for table in self._index.values())
        if end < self._indexed or full:  # cut back, or the index outgrew its bound: afresh
            for table in self._index.values():
                table.clear()
            self._indexed = max(0, end - WINDOW)
        self._indexed = max(self._indexed, end - WINDOW)
        # index every n-gram whose next token is known: those ending at positions < end - 1
        for e in range(self._indexed, end - 1):
            for n, table in self._index.items():
                if e + 1 >= n:
                    table[tuple(history[e + 1 - n : e + 1])] = e + 1
        self._indexed = max(self._indexed, end - 1)

    def _score(self, history: Sequence[int], bar: float) -> None:
        if self._last is None:
            return
        at, drafts = self._last
        if len(history) <= at:  # nothing new was kept (or the context was cut back)
            return
        self._last = None
        kept = 0
        for want, got in zip(drafts, history[at:]):
            if want != got:
                break
            kept += 1
        self.proposed += len(drafts)
        self.kept += kept
        self.kept_share = _DECAY * self.kept_share + (1 - _DECAY) * kept / len(drafts)
        if kept == len(drafts):
            self.length = min(self.max_length, self.length + 2)
        else:
            self.length = max(1, self.length - 1)
        if self.kept_share < bar:
            self._pause = self._next_pause
            self._next_pause = min(MAX_PAUSE, self._next_pause * 2)
        elif kept:
            self._next_pause = 1
