"""Explicit forward passes: ``fwd = ctx.forward(); fwd.input(...); await fwd.execute()``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from pie_core.host import inference as _host
from inferlet.probes import Probe
from inferlet.sampler import Sampler

if TYPE_CHECKING:
    from inferlet.context import Context

__all__ = ["Forward", "Output", "SampleHandle", "ProbeHandle"]


@dataclass(frozen=True, slots=True)
class SampleHandle:
    """Names the rows one ``fwd.sample(...)`` call asked for: ``rows`` index the pass's samples."""

    rows: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProbeHandle:
    """Names one probe of a pass (``row`` indexes the pass's probes)."""

    row: int
    kind: _host.ProbeKind


class Output:
    """What a pass returned. Accessors return None when the handle asked for something else."""

    def __init__(
        self,
        raw: _host.RequestOutput,
        tokens: list[int] | None = None,
        auto_sampler: SampleHandle | None = None,
    ) -> None:
        self._raw = raw
        self._tokens = tokens or []
        self._auto = auto_sampler

    @property
    def tokens(self) -> list[int]:
        """Generator-accepted tokens this step (after stop / max-tokens). Empty for raw passes."""
        return list(self._tokens)

    @property
    def auto_sampler(self) -> SampleHandle | None:
        """Handle of the Generator's auto-attached sampler (None for raw passes)."""
        return self._auto

    @property
    def raw(self) -> _host.RequestOutput:
        """The underlying host result: tokens per sample row, values per probe."""
        return self._raw

    def token(self, h: SampleHandle) -> int | None:
        """The token of a single-index sampler (the first draw)."""
        if not isinstance(h, SampleHandle) or len(h.rows) != 1 or not self._has_rows(h):
            return None
        return self._raw.tokens[h.rows[0]][0]

    def tokens_at(self, h: SampleHandle) -> list[int]:
        """Every token a sampler produced, row by row (all draws of a multinomial row)."""
        if not isinstance(h, SampleHandle) or not self._has_rows(h):
            return []
        return [t for r in h.rows for t in self._raw.tokens[r]]

    def distribution(self, h: ProbeHandle) -> tuple[list[int], list[float]] | None:
        """Top-k ids and probabilities of a Distribution probe."""
        value = self._probe(h, _host.ProbeKind.DISTRIBUTION)
        if value is None:
            return None
        ids, probs = value
        return np.asarray(ids).tolist(), np.asarray(probs, dtype=np.float64).tolist()

    def logits(self, h: ProbeHandle) -> bytes | None:
        """Logits of a Logits probe as native-endian f32 bytes (vocab_size * 4 long)."""
        value = self._probe(h, _host.ProbeKind.LOGITS)
        return None if value is None else np.asarray(value, dtype=np.float32).astype(f"{_ENDIAN}f4").tobytes()

    def logprobs(self, h: ProbeHandle) -> list[float] | None:
        """Log-probabilities of a Logprob/Logprobs probe, in the probe's token order."""
        value = self._probe(h, _host.ProbeKind.LOGPROBS)
        return None if value is None else np.asarray(value, dtype=np.float64).tolist()

    def entropy(self, h: ProbeHandle) -> float | None:
        """Entropy of an Entropy probe."""
        value = self._probe(h, _host.ProbeKind.ENTROPY)
        return None if value is None else float(value)

    def _has_rows(self, h: SampleHandle) -> bool:
        return all(0 <= r < len(self._raw.tokens) for r in h.rows)

    def _probe(self, h: Any, kind: _host.ProbeKind) -> Any:
        if not isinstance(h, ProbeHandle) or h.kind != kind or not 0 <= h.row < len(self._raw.probes):
            return None
        return self._raw.probes[h.row]


_ENDIAN = "<" if sys.byteorder == "little" else ">"


class Forward:
    """A forward pass under construction, bound to a context.

    Positions of ``input`` tokens continue from :meth:`start_position` (``ctx.seq_len`` when
    the pass was created) in the order tokens were added. Nothing runs until :meth:`execute`.
    """

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._start = ctx.seq_len
        self._tokens: list[int] = []
        self._positions: list[int] = []
        self._masks: list[list[int]] | None = None
        self._logit_mask: list[int] | None = None
        self._samples: list[_host.SampleSpec] = []
        self._probes: list[_host.ProbeSpec] = []

    def start_position(self) -> int:
        """Position the first auto-input token will occupy (``ctx.seq_len`` at creation)."""
        return self._start

    def input(self, tokens: Sequence[int]) -> Forward:
        """Add token ids with auto-derived positions."""
        base = self._start + len(self._tokens)
        self._tokens.extend(int(t) for t in tokens)
        self._positions.extend(range(base, base + len(tokens)))
        return self

    def input_at(self, tokens: Sequence[int], positions: Sequence[int]) -> Forward:
        """Add token ids at explicit positions (one per token)."""
        if len(tokens) != len(positions):
            raise ValueError(f"input_at got {len(tokens)} tokens and {len(positions)} positions")
        self._tokens.extend(int(t) for t in tokens)
        self._positions.extend(int(p) for p in positions)
        return self

    def attention_mask(self, masks: Sequence[Sequence[int]]) -> Forward:
        """Per-input-token attention masks: one BRLE row per input token over the KV length
        after this pass (true = attend)."""
        self._masks = [list(m) for m in masks]
        return self

    def mask(self, brle: Sequence[int]) -> Forward:
        """Logit mask (BRLE over the vocabulary, true = allowed) at every sampled position."""
        self._logit_mask = list(brle)
        return self

    def sample(self, indices: Sequence[int] | int, sampler: Sampler) -> SampleHandle:
        """Sample ``sampler`` at each of the given input indices."""
        idx = [indices] if isinstance(indices, int) else list(indices)
        first = len(self._samples)
        self._samples.extend(sampler.spec(i) for i in idx)
        return SampleHandle(tuple(range(first, first + len(idx))))

    def probe(self, idx: int, probe: Probe) -> ProbeHandle:
        """Read ``probe`` at input index ``idx``."""
        spec = probe.spec(idx)
        self._probes.append(spec)
        return ProbeHandle(len(self._probes) - 1, spec.kind)

    async def execute(self) -> Output:
        """Run the pass and return its output."""
        return Output(await self._submit())

    async def _submit(self) -> _host.RequestOutput:
        return await _host.forward(
            self._ctx._handle(),
            self._tokens,
            positions=self._positions,
            attention_masks=self._masks,
            logit_mask=self._logit_mask,
            samples=self._samples,
            probes=self._probes,
        )
