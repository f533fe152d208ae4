"""Explicit forward passes: ``fwd = ctx.forward(); fwd.input(...); await fwd.execute()``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from inferlet.host import grammar as _grammar_host
from inferlet.host import inference as _host
from inferlet.host import speculation as _spec_host
from inferlet.host.errors import InvalidInput
from inferlet.host.types import ProbeKind, ProbeSpec, RequestOutput, SampleSpec
from inferlet._keywords import renamed
from inferlet.cache import KvCache
from inferlet.pending import Pending
from inferlet.probes import Probe
from inferlet.sampler import Sampler

__all__ = ["Forward", "Output", "SampleHandle", "ProbeHandle", "next_pass"]


@dataclass(frozen=True, slots=True)
class SampleHandle:
    """Names what one ``fwd.sample(...)`` call asked for: ``rows`` index the pass's sample
    rows (one per input index; none for :meth:`Sampler.embedding`), ``probes`` the probes the
    sampler reads beside them (:meth:`Sampler.dist`, :meth:`Sampler.embedding`), of kind
    ``probe_kind``."""

    rows: tuple[int, ...]
    probes: tuple[int, ...] = ()
    probe_kind: ProbeKind | None = None


@dataclass(frozen=True, slots=True)
class ProbeHandle:
    """Names one probe of a pass (``row`` indexes the pass's probes)."""

    row: int
    kind: ProbeKind


class Output:
    """What a pass returned. Accessors return None when the handle asked for something else."""

    def __init__(
        self,
        raw: RequestOutput,
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
    def raw(self) -> RequestOutput:
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

    def distribution(self, h: ProbeHandle | SampleHandle) -> tuple[list[int], list[float]] | None:
        """Top-k ids and probabilities of a Distribution probe, or the full distribution of a
        single-index ``Sampler.dist`` handle."""
        value = self._probe(h, ProbeKind.DISTRIBUTION)
        if value is None:
            return None
        ids, probs = value
        return list(ids), list(probs)

    def logits(self, h: ProbeHandle) -> bytes | None:
        """Logits of a Logits probe as native-endian f32 bytes (vocab_size * 4 long)."""
        value = self._probe(h, ProbeKind.LOGITS)
        return None if value is None else bytes(value)

    def logprobs(self, h: ProbeHandle) -> list[float] | None:
        """Log-probabilities of a Logprob/Logprobs probe, in the probe's token order."""
        value = self._probe(h, ProbeKind.LOGPROBS)
        return None if value is None else list(value)

    def entropy(self, h: ProbeHandle) -> float | None:
        """Entropy of an Entropy probe."""
        value = self._probe(h, ProbeKind.ENTROPY)
        return None if value is None else float(value)

    def embedding(self, h: ProbeHandle | SampleHandle) -> list[float] | None:
        """Final hidden state (``hidden_size`` floats) of an Embedding probe or a single-index
        ``Sampler.embedding`` handle."""
        value = self._probe(h, ProbeKind.EMBEDDING)
        return None if value is None else list(value)

    def embeddings_at(self, h: SampleHandle) -> list[list[float]]:
        """Hidden states of every index of a ``Sampler.embedding`` handle, in index order."""
        if not isinstance(h, SampleHandle) or h.probe_kind != ProbeKind.EMBEDDING:
            return []
        if not all(0 <= q < len(self._raw.probes) for q in h.probes):
            return []
        probes: Any = self._raw.probes
        return [list(probes[q]) for q in h.probes]

    def _has_rows(self, h: SampleHandle) -> bool:
        return all(0 <= r < len(self._raw.tokens) for r in h.rows)

    def _probe(self, h: Any, kind: ProbeKind) -> Any:
        if isinstance(h, SampleHandle) and h.probe_kind == kind and len(h.probes) == 1:
            h = ProbeHandle(h.probes[0], kind)
        if not isinstance(h, ProbeHandle) or h.kind != kind or not 0 <= h.row < len(self._raw.probes):
            return None
        return self._raw.probes[h.row]


class Forward:
    """A forward pass under construction, bound to a context (``ctx.forward()``).

    Positions of ``input`` tokens continue from :meth:`start_position` (``ctx.seq_len`` when
    the pass was created) in the order tokens were added. Nothing runs until :meth:`execute`.

    Built with ``ctx.forward(flush=True)``, the pass starts with the context's buffered tokens
    (rows ``0 .. len(ctx.buffer()) - 1``, in buffer order), so probes and samples can read
    them: ``execute`` runs them like ``ctx.flush()`` and takes them out of the buffer, or puts
    them back if the pass fails.
    """

    def __init__(self, model: str, cache: KvCache, pending: Pending, flush: bool = False) -> None:
        """A pass on the context whose KV cache is ``cache`` (model ``model``) and whose buffer
        is ``pending``; its inputs start at the cache's length. Use ``ctx.forward()`` rather
        than this."""
        self._model = model
        self._cache = cache
        self._pending = pending
        self._start = cache.length
        self._tokens: list[int] = []
        self._positions: list[int] = []
        self._masks: list[list[int]] | None = None
        self._logit_mask: list[int] | None = None
        self._samples: list[SampleSpec] = []
        self._probes: list[ProbeSpec] = []
        self._drafts = 0
        self._adapter: Any = None
        self._zo_seed = 0
        self._ahead = 0
        self._stop: list[int] = []
        self._flushed: list[int] = pending.tokens() if flush else []
        self.input(self._flushed)

    def start_position(self) -> int:
        """Position the first auto-input token will occupy (``ctx.seq_len`` at creation)."""
        return self._start

    def page_size(self) -> int:
        """Tokens per KV page of the context this pass runs on (``ctx.page_size``), for sizing
        per-position structures such as attention masks without going back to the context."""
        return self._cache.page_size

    def input(self, tokens: Sequence[int]) -> Forward:
        """Add token ids with auto-derived positions."""
        self._no_drafts_yet("input")
        base = self._start + len(self._tokens)
        self._tokens.extend(int(t) for t in tokens)
        self._positions.extend(range(base, base + len(tokens)))
        return self

    def input_at(self, tokens: Sequence[int], positions: Sequence[int]) -> Forward:
        """Add token ids at explicit positions (one per token)."""
        self._no_drafts_yet("input_at")
        if len(tokens) != len(positions):
            raise ValueError(f"input_at got {len(tokens)} tokens and {len(positions)} positions")
        self._tokens.extend(int(t) for t in tokens)
        self._positions.extend(int(p) for p in positions)
        return self

    def draft(self, tokens: Sequence[int]) -> Forward:
        """Add speculative draft tokens after the inputs, positions continuing.

        The pass verifies them in one go: sample the row before each draft and the last draft
        (``fwd.sample(range(n - 1, n + k), sampler)`` for ``n`` inputs and ``k`` drafts, one
        draw per row). The context keeps the longest run of drafts each equal to the token
        sampled at the row before it, and drops the rest; ``out.raw.drafts_kept`` says how
        many it kept, and the tokens sampled at rows ``n - 1 .. n - 1 + drafts_kept`` are the
        pass's output (the first is the prediction after the inputs, the last follows the
        last kept draft). Drafts cannot be combined with attention masks. A pass verifies at
        most ``inferlet.host.inference.DRAFTS_PER_PASS`` (64) drafts, fewer where the backend
        samples fewer rows per chunk.

        Raises:
            InvalidInput: The pass would hold more than ``DRAFTS_PER_PASS`` drafts.
        """
        tokens = list(tokens)
        if self._drafts + len(tokens) > _host.DRAFTS_PER_PASS:
            raise InvalidInput(f"a pass verifies at most {_host.DRAFTS_PER_PASS} drafts (DRAFTS_PER_PASS), got "
                               f"{self._drafts + len(tokens)}: draft fewer tokens per step")
        self._tokens.extend(int(t) for t in tokens)
        base = self._positions[-1] + 1 if self._positions else self._start
        self._positions.extend(range(base, base + len(tokens)))
        self._drafts += len(tokens)
        return self

    def system_drafts(self, limit: int) -> list[int]:
        """Up to ``limit`` (at most 8) tokens the runtime's n-gram drafter expects after this
        pass's inputs, from the context's own tokens; often ``[]``. For :meth:`draft`."""
        return _spec_host.system_draft(self._cache.handle, self._tokens, limit)

    def attention_mask(self, masks: Sequence[Sequence[int]]) -> Forward:
        """Per-input-token attention masks: one BRLE row per input token over the KV length
        after this pass (true = attend)."""
        self._masks = [list(m) for m in masks]
        return self

    def mask(self, brle: Sequence[int]) -> Forward:
        """Logit mask (BRLE over the vocabulary, true = allowed) at every sampled position
        (a ``fwd.sample(..., mask=...)`` of its own replaces it there)."""
        self._logit_mask = list(brle)
        return self

    def adapter(self, adapter: Any) -> Forward:
        """Run this pass with a LoRA :class:`~inferlet.Adapter` (None = the base weights)."""
        self._adapter = adapter
        return self

    def zo_seed(self, seed: int) -> Forward:
        """Run the adapter perturbed by zo seed ``seed`` (nonzero; see :mod:`inferlet.zo`)."""
        self._zo_seed = seed
        return self

    def sample(self, indices: Sequence[int] | int, sampler: Sampler, *, mask: Any = None) -> SampleHandle:
        """Sample ``sampler`` at each of the given input indices (``Sampler.dist`` also reads
        the distribution there, ``Sampler.embedding`` only the hidden state).

        Args:
            indices: Input rows to sample.
            sampler: The sampling rule.
            mask: A logit mask for these rows only (true = allowed): BRLE runs over the
                vocabulary, or a packed bitmask (``Matcher.packed_mask()``: ``bytes``, or any
                1-D buffer of unsigned bytes such as a numpy ``uint8`` array); it replaces
                :meth:`mask` there.
        """
        idx = [indices] if isinstance(indices, int) else list(indices)
        packed = None if mask is None else self._packed(mask)
        rows: list[int] = []
        probes: list[int] = []
        for i in idx:
            if sampler.draws_tokens:
                rows.append(len(self._samples))
                spec = sampler.spec(i)
                self._samples.append(spec if packed is None else replace(spec, logit_mask=packed))
            extra = sampler.probe_spec(i, masked_by=rows[-1] if rows else -1)
            if extra is not None:
                probes.append(len(self._probes))
                self._probes.append(extra)
        kind = self._probes[probes[0]].kind if probes else None
        return SampleHandle(tuple(rows), tuple(probes), kind)

    @renamed(idx="index")
    def probe(self, index: int, probe: Probe) -> ProbeHandle:
        """Read ``probe`` at input index ``index`` (also accepted as ``idx=``)."""
        spec = probe.spec(index)
        self._probes.append(spec)
        return ProbeHandle(len(self._probes) - 1, spec.kind)

    async def execute(self) -> Output:
        """Run the pass and return its output."""
        flushed = self._flushed
        if flushed:
            try:
                self._pending.take(flushed)
            except ValueError:
                raise InvalidInput(
                    "the context's buffer was run or changed since ctx.forward(flush=True); build the pass again"
                ) from None
        self._cache.changed()
        try:
            raw = await _host.forward(
                self._cache.handle,
                self._tokens,
                positions=self._positions,
                attention_masks=self._masks,
                logit_mask=self._logit_mask,
                samples=self._samples,
                probes=self._probes,
                drafts=self._drafts,
                adapter=None if self._adapter is None else self._adapter._handle,
                zo_seed=self._zo_seed,
                ahead=self._ahead,
                stop=self._stop,
            )
        except BaseException:
            self._pending.restore(flushed)
            self._cache.forget()  # a pass in chunks may have landed some of them
            raise
        self._cache.grew(len(self._tokens) - self._drafts + raw.drafts_kept)
        return Output(raw)

    def _run_ahead(self, ahead: int, stop: list[int]) -> None:
        """Let the engine start the next ``ahead`` passes like this one before they are asked
        (the generator's decode loop; see ``inferlet.host.inference.forward``)."""
        self._ahead, self._stop = ahead, stop

    def _no_drafts_yet(self, what: str) -> None:
        if self._drafts:
            raise InvalidInput(f"fwd.{what}() after fwd.draft(): drafts come after every other input")

    def _packed(self, mask: Any) -> bytes:
        """A packed mask as bytes: a buffer of unsigned bytes is one already, anything else
        (a list, an array of ints) is BRLE runs."""
        try:
            view = memoryview(mask)
        except TypeError:
            return _grammar_host.packed_mask(self._model, list(mask))
        if view.format == "B" and view.ndim == 1:
            return view.tobytes()
        return _grammar_host.packed_mask(self._model, view.tolist())


async def next_pass(cache: KvCache, pending: Pending, token: int) -> RequestOutput:
    """Run the next pass of the decode loop a pass with run-ahead started on the context
    (``inferlet.host.inference.forward_next``): ``token``, the only token buffered, at the next
    position, with the loop's samples and probes; the engine has usually computed it already,
    and may hand over the passes after it too (kept in ``cache.ahead`` for the next steps).
    The caller made sure the loop still runs (nothing changed the context since its last pass)."""
    pending.take([token])
    if cache.ahead:  # taken from the engine with an earlier pass
        cache.grew(1)
        return cache.ahead.popleft()
    try:
        raw, *later = await _host.forward_next(cache.handle_as_is())
    except BaseException:
        pending.restore([token])
        cache.forget()
        cache.changed()
        raise
    cache.ahead.extend(later)
    cache.grew(1)
    return raw
