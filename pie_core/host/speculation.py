"""Host interface ``speculation``: the system n-gram drafter of a context.

Drafts are verified by ``inference.forward(..., drafts=k)``; this module only proposes them.
Each context gets its own :class:`~pie_core.speculation.ngram.NgramDrafter` on first use.
"""

from __future__ import annotations

import time
from typing import Sequence

from pie_core.errors import InvalidInput
from pie_core.host.context import HostContext
from pie_core.speculation.ngram import MAX_LENGTH, NgramDrafter

__all__ = ["system_draft"]


def system_draft(ctx: HostContext, pending: Sequence[int], limit: int) -> list[int]:
    """Up to ``limit`` draft tokens to follow the context's tokens and then ``pending`` (the
    tokens about to run), from the context's n-gram drafter; ``[]`` when it has no guess, its
    recent guesses were poor, or no draft pays for its rows in the batch as the batcher's step
    cost says (see :mod:`pie_core.speculation.ngram`).

    Raises:
        InvalidInput: ``limit`` is not an integer in ``[0, 8]`` or ``pending`` holds a non-integer.
        PieError: The context was released.
    """
    ctx.check_live()
    if not isinstance(limit, int) or not 0 <= limit <= MAX_LENGTH:
        raise InvalidInput(f"limit must be an integer in [0, {MAX_LENGTH}], got {limit!r}")
    if not all(isinstance(t, int) for t in pending):
        raise InvalidInput("pending must be a list of token ids")
    if ctx.drafter is None:
        ctx.drafter = NgramDrafter()
    batcher = ctx.model.batcher
    rows = max(batcher.last_tokens, 1)
    return ctx.drafter.propose(ctx.kv.tokens + list(pending), limit, time.perf_counter(), len(pending) == 1,
                               cost=lambda d: batcher.cost.ratio(rows, d), requests=batcher.last_requests)
