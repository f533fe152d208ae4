"""Host interface ``speculation``: the system n-gram drafter of a context.

Drafts are verified by ``inference.forward(..., drafts=k)``; this module only proposes them.
Each context gets its own :class:`~pie_core.speculation.ngram.NgramDrafter` on first use.
"""

from __future__ import annotations

from typing import Sequence

from inferlet.host._declare import host
from inferlet.host.types import Context

__all__ = ["system_draft"]


@host
def system_draft(ctx: Context, pending: Sequence[int], limit: int) -> list[int]:
    """Up to ``limit`` draft tokens to follow the context's tokens and then ``pending`` (the
    tokens about to run), from the context's n-gram drafter; ``[]`` when it has no guess or
    its recent guesses were poor (see :mod:`pie_core.speculation.ngram`).

    Raises:
        InvalidInput: ``limit`` is not an integer in ``[0, 8]`` or ``pending`` holds a non-integer.
        PieError: The context was released.
    """
