"""One inferlet's forward pass as the batcher receives it, after the host validated it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from pie_core.values import ProbeSpec, RequestOutput, SampleSpec

__all__ = ["SampleSpec", "ProbeSpec", "ForwardRequest", "RequestOutput"]


@dataclass(slots=True)
class ForwardRequest:
    """Input tokens, where their K/V goes, and what to read back.

    ``page_ids`` are the request's physical pages in sequence order (including the pages this
    pass writes); ``last_page_len`` the valid slots of the last page after the writes;
    ``write_slots`` the slot each input token writes; ``attention_mask`` None (causal by slot)
    or bool ``[len(token_ids), kv_len]``.
    """

    token_ids: np.ndarray
    positions: np.ndarray
    page_ids: np.ndarray
    last_page_len: int
    write_slots: np.ndarray
    attention_mask: np.ndarray | None = None
    samples: tuple[SampleSpec, ...] = ()
    probes: tuple[ProbeSpec, ...] = ()
    adapter_id: int = -1
    zo_seed: int = 0
    future: asyncio.Future[RequestOutput] | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
