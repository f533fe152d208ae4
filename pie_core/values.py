"""Value types of a forward pass that cross the host API by value: what to sample and probe, and
what comes back.

Standard library only: the SDK imports these, and it also runs where numpy is not installed
(a WebAssembly guest). ``pie_core.hookspec`` and ``pie_core.scheduler.request`` re-export them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

__all__ = ["SamplerKind", "ProbeKind", "SampleSpec", "ProbeSpec", "RequestOutput"]


class SamplerKind(IntEnum):
    """How a sample row picks its token(s). Temperature applies before every filter."""

    ARGMAX = 0
    TOP_K = 1
    TOP_P = 2
    MIN_P = 3
    TOP_K_TOP_P = 4
    MULTINOMIAL = 5  # ``draws`` independent draws from the full tempered distribution


class ProbeKind(IntEnum):
    """What a probe row reads at one input position (off its logits, except EMBEDDING)."""

    LOGITS = 0  # float32[vocab], raw (after the logit mask: masked entries are -inf)
    DISTRIBUTION = 1  # top-k (ids, probs) of softmax(logits / temperature); k = 0 means all
    LOGPROBS = 2  # log-softmax at the given token ids, in their order
    ENTROPY = 3  # -sum p log p of softmax(logits), a float
    EMBEDDING = 4  # float32[hidden]: the final hidden state (after the final norm, before the
    # output projection). Only sent to backends declaring the "embeddings" feature (since 1.1).


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """Sample one input row of the request.

    ``index`` is relative to the request's input tokens. ``logit_mask`` is None for no mask, or
    the vocabulary packed 8 tokens per byte, little bit order (token ``t`` is bit ``t & 7`` of
    byte ``t >> 3``): ``bytes`` from the SDK, which ``pie_core.host.inference.forward`` turns
    into the uint8 numpy row (``np.packbits(bitorder="little")``) the batcher takes.
    """

    index: int
    kind: SamplerKind = SamplerKind.ARGMAX
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    draws: int = 1
    seed: int = 0
    logit_mask: Any = None


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


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """The part of a batch's output that belongs to one request.

    ``tokens[i]`` holds the ids drawn for ``samples[i]`` (one unless multinomial draws > 1);
    ``probes[i]`` the value of ``probes[i]``. For a pass with speculative drafts,
    ``drafts_kept`` says how many drafts the KV kept (see ``pie_core.host.inference.forward``).

    Inside the engine a probe value is what the backend returned (numpy arrays, see
    ``pie_core.hookspec.BatchOutput``); ``pie_core.host.inference.forward`` hands the SDK plain
    values: native-endian float32 ``bytes`` for LOGITS, ``(list[int], list[float])`` for
    DISTRIBUTION, ``list[float]`` for LOGPROBS and EMBEDDING, ``float`` for ENTROPY.
    """

    tokens: tuple[tuple[int, ...], ...]
    probes: tuple[object, ...]
    drafts_kept: int = 0
