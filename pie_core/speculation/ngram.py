"""The system drafter: prompt lookup over a context's own tokens, with an adaptive length.

A context's text often repeats itself (code being rewritten, a passage being quoted), so the
tokens that followed the latest earlier occurrence of its last few tokens are a good guess at
what comes next. :class:`NgramDrafter` keeps an index from each n-gram (``MIN_NGRAM`` to
``MAX_NGRAM`` tokens, over the last ``WINDOW`` tokens) to where its latest occurrence
continues, updated as the context grows, and proposes up to ``length`` tokens from the longest n-gram that matches.

The length adapts to how many of its drafts were kept (it scores each proposal against the
tokens the context holds at the next call): +2 after a proposal kept whole, -1 otherwise
(at least 1). After a poor proposal it proposes nothing for a while, and for twice as long
after each further poor one (up to ``MAX_PAUSE`` steps), so text that does not repeat costs
next to nothing.

What is poor depends on what a draft costs, which depends on the backend and on the batch the
context shares (a NumPy matrix-vector product turns into a slower matrix-matrix one; in a full
batch every row is compute others wait for). So the drafter times the decode steps of its own
context (the time between its calls) with and without drafts and keeps exponential averages:
a proposal is poor when the tokens a drafting step yields (kept drafts + 1) are fewer than its
time over a plain step's (it sits a step out to time one if it has none). Until both times
are known, poor means a kept share (an
exponential average from one half) under ``LOW``.

Under a batch (the engine's case), the batcher's fit of step time against batch rows
(:class:`~pie_core.scheduler.step_cost.StepCost`) replaces the context's own timing: ``propose``
gets ``cost(d)``, how many times longer the batch takes with ``d`` more rows, and the batch's
requests ``R``, and keeps the number of drafts ``d`` that maximises the batch's expected tokens
per unit of time, ``(R + p + ... + p^d) / cost(d)``, with ``p`` the context's per-draft
acceptance so far; ``d = 0`` when no number pays. A draft's rows slow every request of the
batch, so in a full CPU batch, where each row costs about as much as a request, a draft almost
never pays; on a GPU, where a row costs next to nothing, drafts pay freely; alone (``R = 1``)
the context weighs its own gain against its own step.

Drafts never change what is generated (the verifier keeps only drafts equal to what the model
samples), so a stale or wrong guess costs time, never correctness.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["NgramDrafter"]

MIN_NGRAM = 2
MAX_NGRAM = 4
START_LENGTH = 4
MAX_LENGTH = 8
LOW = 0.3
MAX_PAUSE = 32
WINDOW = 16384  # the index covers at most the last WINDOW tokens (bounded memory per context)
_DECAY = 0.5
FIRST_PROBE = 4  # refused proposals before one draft probes anyway (then twice as many, up to MAX_PAUSE)
_FADE = 0.8  # weight of the evidence so far at each scored proposal: text changes (a preamble, then a quote)


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
        self.step_s: dict[bool, float | None] = {False: None, True: None}  # decode step time, by drafted
        self.yield_per_draft_step: float | None = None  # kept drafts + 1, averaged
        self._prev: tuple[float, bool] | None = None  # (time, drafted) of the last decode step's call
        self.accepted = 0.0  # drafts kept, over recent proposals (older ones weigh less: _FADE)
        self.cut = 0.0  # recent proposals with a draft refused
        self._unpaid = 0  # proposals the budget refused since the last probe
        self._next_probe = FIRST_PROBE
        self._last_cost: float | None = None  # cost(d) of the last proposal, when a batch cost was known
        self._last_requests = 1.0  # the batch's requests then

    def propose(self, history: Sequence[int], limit: int, now: float | None = None, decode: bool = True,
                cost: Callable[[int], float | None] | None = None, requests: float = 1.0) -> list[int]:
        """Up to ``limit`` tokens likely to follow ``history`` (the context's tokens so far,
        including those about to run); ``[]`` when nothing matches or drafting pauses.

        ``now`` (seconds, monotonic) times the steps between calls; ``decode`` says this step
        runs one token (a longer step, such as the prompt's, is not timed). ``cost(d)``, where
        given and not None, is how many times longer the step takes with ``d`` draft rows, in a
        batch of ``requests`` (see the module doc)."""
        if now is not None and self._prev is not None:
            at, drafted = self._prev
            old = self.step_s[drafted]
            self.step_s[drafted] = now - at if old is None else _DECAY * old + (1 - _DECAY) * (now - at)
        self._score(history)
        self._extend_index(history)
        drafts: list[int] = []
        if limit > 0 and self._pause == 0:
            drafts = self._lookup(history, min(limit, self.length))
            if drafts and cost is not None and self.accepted + self.cut > 0:  # a first proposal probes
                drafts = self._worth(drafts, cost, requests)
        self._pause = max(0, self._pause - 1)
        if drafts:
            self._last = (len(history), drafts)
        self._prev = (now, bool(drafts)) if now is not None and decode else None
        return drafts

    def acceptance(self) -> float:
        """The chance that a draft is kept given the ones before it were (Laplace's estimate over
        this context's recent proposals: kept drafts against refusals)."""
        return (self.accepted + 1) / (self.accepted + self.cut + 2)

    def _worth(self, drafts: list[int], cost: Callable[[int], float | None], requests: float = 1.0) -> list[int]:
        """The leading drafts worth their rows: the count with the most expected tokens of the
        batch per unit of step time (none when no count beats a plain step)."""
        p = self.acceptance()
        base = max(requests, 1.0)
        best, best_rate, expected = 0, base, base
        for d in range(1, len(drafts) + 1):
            expected += p**d
            ratio = cost(d)
            if ratio is None:  # the batch's cost is not known yet: the drafter's own rules decide
                self._last_cost = None
                return drafts
            if expected / ratio > best_rate * (1 + 1e-9):
                best, best_rate = d, expected / ratio
        if best == 0:  # no count pays on what is known: now and then one draft probes whether that changed
            self._unpaid += 1
            if self._unpaid < self._next_probe:
                self._last_cost = None
                return []
            self._unpaid, self._next_probe, best = 0, min(MAX_PAUSE, 2 * self._next_probe), 1
        self._last_cost = cost(best)
        self._last_requests = base
        return drafts[:best]

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

    def _score(self, history: Sequence[int]) -> None:
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
        self.accepted = _FADE * self.accepted + kept
        self.cut = _FADE * self.cut + (kept < len(drafts))
        if kept:
            self._next_probe = FIRST_PROBE
        self.kept_share = _DECAY * self.kept_share + (1 - _DECAY) * kept / len(drafts)
        old = self.yield_per_draft_step
        self.yield_per_draft_step = kept + 1 if old is None else _DECAY * old + (1 - _DECAY) * (kept + 1)
        if kept == len(drafts):
            self.length = min(self.max_length, self.length + 2)
        else:
            self.length = max(1, self.length - 1)
        if self.step_s[False] is None and self.step_s[True] is not None:
            self._pause = max(self._pause, 1)  # sit one step out to time a plain one
        if self._poor():
            self._pause = self._next_pause
            self._next_pause = min(MAX_PAUSE, self._next_pause * 2)
        elif kept:
            self._next_pause = 1

    def _poor(self) -> bool:
        if self._last_cost is not None and self.yield_per_draft_step is not None:  # the batch's cost, not ours
            return self.yield_per_draft_step - 1 < self._last_requests * (self._last_cost - 1)
        plain, drafting = self.step_s[False], self.step_s[True]
        if plain is None or drafting is None or self.yield_per_draft_step is None:
            return self.kept_share < LOW
        return self.yield_per_draft_step < drafting / plain
