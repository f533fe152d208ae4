"""The oracle of the SDK's KV-cache tests (run them on the ``cpu`` fixture).

A context that reached a token sequence by any route (forks, snapshots, truncation, prefix
reuse, rejected drafts, a failed and retried step) must give the next-token logits a fresh
context gives after running the same sequence in one pass. The fresh pass carries an explicit
causal attention mask, so it neither reads nor fills the prefix cache: the reference never
shares a page with the context under test.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from inferlet import Context, Model, runtime
from inferlet.probes import Logits

__all__ = ["model", "history", "logits_after", "fresh_logits", "assert_same_logits"]


def model() -> Model:
    return Model.load(runtime.models()[0])


def history(ctx: Context) -> list[int]:
    """Every token the context holds: those in its KV (the core's record, a test-only peek), then
    the buffer (``generate`` adds the chat cue and leaves its last token buffered)."""
    return list(ctx._ctx.kv.tokens) + ctx.buffer()


async def logits_after(ctx: Context, tokens: Sequence[int] = ()) -> list[float]:
    """Run the buffer plus ``tokens`` on ``ctx`` (they enter its KV); the logits after the last."""
    ctx.append(tokens)
    fwd = ctx.forward(flush=True)
    h = fwd.probe(len(ctx.buffer()) - 1, Logits())
    out = await fwd.execute()
    return np.frombuffer(out.logits(h), dtype=np.float32).tolist()  # a main's return value is JSON


async def fresh_logits(tokens: Sequence[int]) -> list[float]:
    """The logits after ``tokens`` computed in one pass by a new context, off the prefix cache."""
    n = len(tokens)
    with Context(model()) as ctx:
        fwd = ctx.forward().input(list(tokens)).attention_mask([[0, i + 1, n - i - 1] for i in range(n)])
        h = fwd.probe(n - 1, Logits())
        out = await fwd.execute()
        return np.frombuffer(out.logits(h), dtype=np.float32).tolist()  # a main's return value is JSON


def assert_same_logits(got: Sequence[float], want: Sequence[float], what: str = "") -> None:
    """Equal up to float32 summation order; a wrong or stale KV page moves them by far more."""
    assert len(got) == len(want) > 0, what
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=0, atol=2e-4, err_msg=what)
