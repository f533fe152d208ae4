"""What a batch's rows cost: the backend's step time as a line in the batch's tokens, learnt online.

Speculative drafts add rows to a batch, and every row is compute the batch's other requests wait
for. Whether a draft pays depends on the backend and the batch: on a GPU a decode step costs
about the same at 16 rows as at 24, on a CPU it grows with every row. :class:`StepCost` fits
``seconds = fixed + per_token * tokens`` over the batches that landed (exponentially weighted
least squares, so it follows the load), and answers the one question the drafter asks: by what
factor does a batch of ``rows`` slow down with ``extra`` more (:meth:`StepCost.ratio`).

A line misses steps: a backend may switch kernels past some number of rows (the torch CPU path
does), so the first draft row of a batch can cost far more than the next. So it also keeps each
batch size's own average time, and where both sizes of a question have been seen
(:data:`MIN_SEEN` times each), those answer it.
"""

from __future__ import annotations

__all__ = ["StepCost", "DECAY", "MIN_BATCHES", "MIN_SEEN"]

DECAY = 0.05
"""Weight of the newest batch in the averages."""
MIN_BATCHES = 8
"""Batches seen before the fit is trusted."""
MIN_SEEN = 3
"""Batches of one size seen before that size's own average answers for it."""
MAX_SIZES = 4096
"""Batch sizes whose averages are kept (larger ones count in the line only)."""


class StepCost:
    """An online fit of batch seconds against batch tokens."""

    def __init__(self) -> None:
        self.batches = 0
        self._n = self._t = self._nn = self._nt = 0.0  # weighted means of tokens, seconds, tokens^2, tokens*seconds
        self.rows = 0.0  # weighted mean batch size (tokens)
        self._sizes: dict[int, tuple[int, float]] = {}  # tokens -> (batches seen, mean seconds)

    def observe(self, tokens: int, seconds: float) -> None:
        """A batch of ``tokens`` rows took ``seconds`` on the backend."""
        w = 1.0 if self.batches == 0 else DECAY
        n, t = float(tokens), float(seconds)
        self._n += w * (n - self._n)
        self._t += w * (t - self._t)
        self._nn += w * (n * n - self._nn)
        self._nt += w * (n * t - self._nt)
        self.rows = self._n
        self.batches += 1
        if tokens < MAX_SIZES:
            seen, mean = self._sizes.get(tokens, (0, t))
            self._sizes[tokens] = (seen + 1, mean + (t - mean) / min(seen + 1, int(1 / DECAY)))

    def line(self) -> tuple[float, float] | None:
        """``(fixed, per_token)`` seconds, or None while too few batches (or sizes too alike) say."""
        if self.batches < MIN_BATCHES:
            return None
        var = self._nn - self._n * self._n
        if var <= 1e-9 * max(1.0, self._n * self._n):  # every batch the same size: no slope to see
            return None
        per = max(0.0, (self._nt - self._n * self._t) / var)
        fixed = max(0.0, self._t - per * self._n)
        return fixed, per

    def ratio(self, rows: float, extra: int) -> float | None:
        """How many times longer a batch of ``rows + extra`` tokens takes than one of ``rows``:
        from those sizes' own averages where both were seen enough, else from the line; None
        while neither is known."""
        base_seen, base_mean = self._sizes.get(int(rows), (0, 0.0))
        more_seen, more_mean = self._sizes.get(int(rows) + extra, (0, 0.0))
        if base_seen >= MIN_SEEN and more_seen >= MIN_SEEN and base_mean > 0:
            return max(1.0, more_mean / base_mean)
        fit = self.line()
        if fit is None:
            return None
        fixed, per = fit
        base = fixed + per * max(rows, 1.0)
        if base <= 0:
            return None
        return (base + per * extra) / base
