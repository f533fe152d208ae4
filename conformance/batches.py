"""Building forward requests for the cases, and reading their rows back out of a batch output.

Cases describe work as :class:`~pie_core.scheduler.request.ForwardRequest` objects and let the
core's own assembler (:func:`pie_core.scheduler.assemble.assemble`) flatten them, so the backend
sees exactly the batches the engine sends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from pie_core.hookspec import BatchOutput, ProbeKind
from pie_core.scheduler.request import ForwardRequest, ProbeSpec, SampleSpec

__all__ = ["TokenIds", "kv_request", "probe_logits", "request_slices", "KvSequence", "pack_mask"]

TokenIds = Sequence[int] | np.ndarray
"""Token ids as a list or an integer array."""


def kv_request(
    tokens: TokenIds,
    pages: Sequence[int],
    page_size: int,
    start: int = 0,
    positions: TokenIds | None = None,
    kv_len: int | None = None,
    mask: np.ndarray | None = None,
    probe_all: bool = False,
    samples: tuple[SampleSpec, ...] = (),
    probes: tuple[ProbeSpec, ...] = (),
) -> ForwardRequest:
    """A request writing ``tokens`` at slots ``start, start+1, ...`` of the pages given.

    Args:
        tokens: Input token ids.
        pages: Physical pages in sequence order (only as many as the KV length needs are used).
        page_size: Slots per page.
        start: Slot of the first token.
        positions: RoPE positions (default: the slots).
        kv_len: KV length after the writes (default ``start + len(tokens)``).
        mask: Custom attention mask ``bool[len(tokens), kv_len]``, or None for causal.
        probe_all: Append a LOGITS probe for every input row (after ``probes``).
        samples: Sample rows.
        probes: Probe rows.

    Raises:
        ValueError: Fewer pages than the KV length needs.
    """
    n = len(tokens)
    slots = np.arange(start, start + n, dtype=np.int32)
    length = start + n if kv_len is None else kv_len
    used = -(-length // page_size)
    page_ids = np.asarray(pages[:used], dtype=np.int32)
    if len(page_ids) < used:
        raise ValueError(f"{used} pages needed, {len(pages)} given")
    extra = tuple(ProbeSpec(index=i, kind=ProbeKind.LOGITS) for i in range(n)) if probe_all else ()
    return ForwardRequest(
        token_ids=np.asarray(tokens, dtype=np.int32),
        positions=slots.copy() if positions is None else np.asarray(positions, dtype=np.int32),
        page_ids=page_ids,
        last_page_len=length - (used - 1) * page_size,
        write_slots=slots,
        attention_mask=mask,
        samples=samples,
        probes=probes + extra,
    )


def request_slices(
    requests: Sequence[ForwardRequest], output: BatchOutput
) -> list[tuple[list[tuple[int, ...]], tuple[Any, ...]]]:
    """Per request, ``(tokens of each sample row, probe values)`` cut from a batch output.

    Raises:
        AssertionError: The output has the wrong number of tokens or probe values.
    """
    draws = [s.draws for r in requests for s in r.samples]
    expected_tokens = int(sum(draws))
    expected_probes = sum(len(r.probes) for r in requests)
    tokens = np.asarray(output.tokens)
    assert tokens.shape == (expected_tokens,), (
        f"BatchOutput.tokens has shape {tokens.shape}; the batch's sample rows draw {expected_tokens} tokens"
    )
    assert len(output.probes) == expected_probes, (
        f"BatchOutput.probes has {len(output.probes)} values; the batch has {expected_probes} probe rows"
    )
    flat = tokens.tolist()
    out = []
    t = q = 0
    for r in requests:
        rows = []
        for s in r.samples:
            rows.append(tuple(int(x) for x in flat[t : t + s.draws]))
            t += s.draws
        out.append((rows, tuple(output.probes[q : q + len(r.probes)])))
        q += len(r.probes)
    return out


def probe_logits(output: BatchOutput, requests: Sequence[ForwardRequest]) -> list[np.ndarray]:
    """Per request, the ``[n, vocab]`` logits of its trailing ``probe_all`` LOGITS probes."""
    out, q = [], 0
    for r in requests:
        values = output.probes[q : q + len(r.probes)]
        q += len(r.probes)
        out.append(np.stack(values[len(values) - r.num_tokens :]))
    return out


def pack_mask(allowed: np.ndarray) -> np.ndarray:
    """Pack a bool vocabulary mask (true = allowed) the way the contract wants it."""
    return np.packbits(np.asarray(allowed, dtype=bool), bitorder="little")


@dataclass(slots=True)
class KvSequence:
    """One sequence growing over several passes on a fixed list of physical pages.

    ``step`` builds the request for the next tokens (written at the next free slots) and
    advances the length; ``rewind`` drops the last slots (as a rejected draft does).
    """

    pages: Sequence[int]
    page_size: int
    length: int = 0
    positions_offset: int = 0
    history: list[int] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return len(self.pages) * self.page_size

    def step(
        self,
        tokens: TokenIds,
        *,
        mask: np.ndarray | None = None,
        samples: tuple[SampleSpec, ...] = (),
        probes: tuple[ProbeSpec, ...] = (),
    ) -> ForwardRequest:
        """The request writing ``tokens`` after the current length (then the length grows)."""
        n = len(tokens)
        if self.length + n > self.capacity:
            raise ValueError(f"sequence of {self.length + n} slots does not fit {len(self.pages)} pages")
        start = self.length
        req = kv_request(
            tokens,
            self.pages,
            self.page_size,
            start=start,
            positions=np.arange(start, start + n) + self.positions_offset,
            mask=mask,
            samples=samples,
            probes=probes,
        )
        self.length += n
        self.history.extend(int(t) for t in tokens)
        return req

    def rewind(self, slots: int) -> None:
        """Forget the last ``slots`` tokens; the next step overwrites their slots."""
        if not 0 <= slots <= self.length:
            raise ValueError(f"cannot rewind {slots} of {self.length} slots")
        self.length -= slots
        del self.history[self.length :]
