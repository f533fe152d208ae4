"""One inferlet's forward pass as the batcher receives it, after the host validated it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from pie_core.hookspec import ProbeKind, SamplerKind

__all__ = ["SampleSpec", "ProbeSpec", "ForwardRequest", "RequestOutput"]


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """Sample one input row of the request.

    ``index`` is relative to the request's input tokens. ``logit_mask`` is a packed
    (``np.packbits(bitorder="little")``) uint8 row over the vocabulary, or None for no mask.
    """

    index: int
    kind: SamplerKind = SamplerKind.ARGMAX
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    draws: int = 1
    seed: int = 0
    logit_mask: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """Probe one input row of the request.

    ``masked_by`` is the position in the request's ``samples`` list whose logit mask applies
    to this probe, or -1 for the raw logits.
    """

    index: int
    kind: ProbeKind
    temperature: float = 1.0
    k: int = 0
    token_ids: tuple[int, ...] = ()
    masked_by: int = -1


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


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """The part of a batch's output that belongs to one request.

    ``tokens[i]`` holds the ids drawn for ``samples[i]`` (one unless multinomial draws > 1);
    ``probes[i]`` the value of ``probes[i]``. For a pass with speculative drafts,
    ``drafts_kept`` says how many drafts the KV kept (see ``pie_core.host.inference.forward``).
    """

    tokens: tuple[tuple[int, ...], ...]
    probes: tuple[object, ...]
    drafts_kept: int = 0
