"""Host interface ``inference``: one forward pass of a context, validated and batched."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from inferlet.host.inference import DRAFTS_PER_PASS
from pie_core import brle
from pie_core.adapters.store import AdapterRecord, AdapterStore
from pie_core.engine.engine import LoadedModel
from pie_core.errors import BackendError, InvalidInput, Unsupported
from pie_core.hookspec import Capabilities
from pie_core.host.adapter import HostAdapter
from pie_core.host.ahead import Chain, decode_step
from pie_core.host.binding import soon
from pie_core.host.context import HostContext
from pie_core.values import ProbeKind, ProbeSpec, RequestOutput, SampleSpec, SamplerKind
from pie_core.scheduler.passes import Pass, Tag, run_pass

__all__ = ["forward", "forward_next", "SampleSpec", "ProbeSpec", "RequestOutput", "SamplerKind", "ProbeKind", "MAX_STOP",
           "DRAFTS_PER_PASS"]

MAX_STOP = 1024
"""Stop tokens a pass that runs ahead may name."""

async def forward(
    ctx: HostContext,
    tokens: Sequence[int],
    positions: Sequence[int] | None = None,
    attention_masks: Sequence[Sequence[int]] | None = None,
    logit_mask: Sequence[int] | None = None,
    samples: Sequence[SampleSpec] = (),
    probes: Sequence[ProbeSpec] = (),
    drafts: int = 0,
    adapter: HostAdapter | None = None,
    zo_seed: int = 0,
    ahead: int = 0,
    stop: Sequence[int] = (),
) -> RequestOutput:
    """Run one pass of ``ctx``: ``inferlet.host.inference.forward`` documents the arguments, the
    result and the errors. Validated here (ids, positions, masks, samples, probes, limits),
    batched by the model's batcher, and with ``ahead`` the start of a :class:`Chain`."""
    ctx.check_live()
    model = ctx.model
    if not model.alive:  # its replica died: fail here, not on its backend
        raise BackendError(f"replica {model.index} of model {model.name!r} died; this context is lost, run the inferlet again")
    caps = model.caps
    _check_draft_count(drafts, caps, model.backend)  # first: a pass of 10,000 drafts must cost nothing
    n = len(tokens)
    if n == 0:
        if samples or probes:
            raise InvalidInput("a pass with samples or probes needs at least one input token")
        ctx.drop_chain()
        return RequestOutput(tokens=(), probes=())
    ids = _check_tokens(tokens, model.spec.vocab_size)
    ahead = _check_ahead(ahead, stop)
    _check_rows(samples, probes, n)
    verifiers = _check_drafts(drafts, n, samples, attention_masks is not None)
    if attention_masks is not None and "custom_mask" not in caps.features:
        raise Unsupported(f"backend {model.backend!r} does not support custom attention masks")
    if probes and "probes" not in caps.features:
        raise Unsupported(f"backend {model.backend!r} does not support probes")
    if "embeddings" not in caps.features and any(p.kind == ProbeKind.EMBEDDING for p in probes):
        raise Unsupported(f"backend {model.backend!r} does not support embedding probes (feature 'embeddings')")
    if logit_mask is not None and "logit_mask" not in caps.features:
        raise Unsupported(f"backend {model.backend!r} does not support logit masks")
    samples = _sample_masks(samples, model.spec.vocab_size, "logit_mask" in caps.features, model.backend)
    record = _check_adapter(adapter, zo_seed, model)
    if logit_mask is not None:  # rows with a mask of their own keep it
        packed = brle.pack_bits(brle.decode(logit_mask, model.spec.vocab_size, "logit mask"))
        samples = [s if s.logit_mask is not None else replace(s, logit_mask=packed) for s in samples]
    if n > caps.max_batch_tokens and attention_masks is not None:
        raise Unsupported(
            f"a pass with a custom attention mask may hold at most {caps.max_batch_tokens} tokens; got {n}"
        )
    _check_limits(caps, model.backend, samples, n, attention_masks is not None, ctx.kv.length)
    binding = _Binding(record, zo_seed, ctx.owner.engine.adapters)
    ctx.drop_chain()  # a pass of its own: a decode loop run ahead on the context ends first
    async with ctx.lock, binding:
        ctx.check_live()
        base = ctx.kv.length
        pos = _check_positions(positions, n, base, model.spec.max_position)
        masks = None if attention_masks is None else _decode_masks(attention_masks, n, base + n)
        work = Pass(ids, pos, masks, samples, probes, drafts, verifiers, binding.tag)
        out = await run_pass(model, ctx.holder, work)
    if ahead and not ctx.released and decode_step(n, samples, probes, drafts, attention_masks is not None, out):
        last = n - 1
        chain = Chain(ctx, tuple(replace(s, index=0) for s in samples),
                      tuple(replace(p, index=0) for p in probes if p.index == last), binding.tag, stop, ahead,
                      binding.hold())
        ctx.chain = chain
        chain.landed(out)
    return _result(out, probes)


def _forward_next_soon(ctx: HostContext, done: Callable[[bool, Any], None]) -> Callable[[], None] | None:
    """:func:`forward_next` as callbacks, when its pass runs ahead (see ``binding.soon``)."""
    chain = ctx.chain
    if ctx.released or chain is None:
        return None
    probes = chain.probes
    return chain.next_soon(lambda ok, value: done(ok, [_result(out, probes) for out in value] if ok else value))


@soon(_forward_next_soon)
async def forward_next(ctx: HostContext) -> list[RequestOutput]:
    """The next pass of the decode loop a ``forward(..., ahead=n)`` started on ``ctx`` (the token
    its last pass sampled, at the next position, with the same samples and probes; usually
    computed already), then each pass after it that landed already: run-ahead, see
    :mod:`pie_core.host.ahead`."""
    ctx.check_live()
    chain = ctx.chain
    if chain is None:
        raise InvalidInput("no decode loop runs ahead on this context: start one with forward(..., ahead=n), "
                           "and note that any other call that changes the context ends it")
    return [_result(out, chain.probes) for out in await chain.next()]


def _result(out: RequestOutput, probes: Sequence[ProbeSpec]) -> RequestOutput:
    return out if not out.probes else replace(out, probes=tuple(_plain(p.kind, v) for p, v in zip(probes, out.probes)))


class _Binding:
    """The adapter a pass runs with, held in use (not freed) while the pass runs (and, for a
    pass run ahead, until it is taken or dropped: :meth:`hold`)."""

    def __init__(self, record: AdapterRecord | None, zo_seed: int, store: AdapterStore) -> None:
        self.record = record
        self.store = store
        self.zo_seed = zo_seed
        self.tag = None if record is None else Tag(record, zo_seed, record.salt(zo_seed))

    async def __aenter__(self) -> None:
        if self.record is not None:
            self.store.use(self.record)

    async def __aexit__(self, *exc: object) -> None:
        if self.record is not None:
            self.store.unuse(self.record)

    def hold(self) -> Callable[[], None] | None:
        """Hold the adapter in use once more; returns what lets it go (None: no adapter)."""
        record, store = self.record, self.store
        if record is None:
            return None
        store.use(record)
        return lambda: store.unuse(record)


def _check_ahead(ahead: int, stop: Sequence[int]) -> int:
    if isinstance(ahead, bool) or not isinstance(ahead, int) or not 0 <= ahead < 2**32:
        raise InvalidInput(f"ahead must be an integer in [0, 2**32), got {ahead!r}")
    if len(stop) > MAX_STOP or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop):
        raise InvalidInput(f"stop must be at most {MAX_STOP} token ids")
    return ahead


def _check_adapter(adapter: HostAdapter | None, zo_seed: int, model: LoadedModel) -> AdapterRecord | None:
    if isinstance(zo_seed, bool) or not isinstance(zo_seed, int) or not -(1 << 63) <= zo_seed < (1 << 63):
        raise InvalidInput(f"zo_seed must be a 64-bit integer (0 = none), got {zo_seed!r}")
    if adapter is None:
        if zo_seed:
            raise InvalidInput("zo_seed perturbs an adapter: pass adapter= as well")
        return None
    if not isinstance(adapter, HostAdapter):
        raise InvalidInput(f"adapter must be an Adapter, got {type(adapter).__name__}")
    adapter.check_live()
    record = adapter.record
    if record.model is not model:
        if record.model.name == model.name:  # data-parallel replicas: an adapter lives on one of them
            raise InvalidInput(f"adapter {record.name!r} lives on another replica of model {model.name!r} than this "
                               "context; run it from an inferlet on that replica, or load it from a file here")
        raise InvalidInput(f"adapter {record.name!r} belongs to model {record.model.name!r}, not {model.name!r}")
    if "adapters" not in model.caps.features:
        raise Unsupported(f"backend {model.backend!r} does not run LoRA adapters (feature 'adapters')")
    if zo_seed:
        if "zo" not in model.caps.features:
            raise Unsupported(f"backend {model.backend!r} does not run zo passes (feature 'zo')")
        if record.zo is None:
            raise InvalidInput(f"zo_seed needs an adapter set up with zo.initialize; {record.name!r} is not")
    return record


def _sample_masks(samples: Sequence[SampleSpec], vocab: int, supported: bool, backend: str) -> list[SampleSpec]:
    """``samples`` with each packed logit mask (bytes from the SDK, or a uint8 array) as the
    uint8 array the batcher takes."""
    width = (vocab + 7) // 8
    checked = []
    for i, s in enumerate(samples):
        mask = s.logit_mask
        if mask is not None:
            if not supported:
                raise Unsupported(f"backend {backend!r} does not support logit masks")
            if isinstance(mask, (bytes, bytearray)) and len(mask) == width:
                s = replace(s, logit_mask=np.frombuffer(mask, dtype=np.uint8))
            elif not (isinstance(mask, np.ndarray) and mask.dtype == np.uint8 and mask.shape == (width,)):
                raise InvalidInput(f"sample {i}'s logit mask must be {width} bytes, a packed uint8 array over the "
                                   "vocabulary (8 tokens per byte, little bit order)")
        checked.append(s)
    return checked


def _plain(kind: ProbeKind, value: Any) -> Any:
    """A probe's value as the SDK reads it (see :class:`RequestOutput`), with no numpy in it."""
    if kind == ProbeKind.LOGITS:
        return np.asarray(value, dtype=np.float32).tobytes()
    if kind == ProbeKind.DISTRIBUTION:
        ids, probs = value
        return np.asarray(ids).tolist(), np.asarray(probs, dtype=np.float64).tolist()
    if kind == ProbeKind.ENTROPY:
        return float(value)
    return np.asarray(value, dtype=np.float64).tolist()  # LOGPROBS, EMBEDDING


def _check_draft_count(drafts: int, caps: Capabilities, backend: str) -> None:
    limit = min(DRAFTS_PER_PASS, caps.max_sample_rows - 1, caps.max_batch_tokens - 1)
    if drafts and (isinstance(drafts, bool) or not isinstance(drafts, int) or not 0 <= drafts <= limit):
        raise InvalidInput(
            f"a pass may verify at most {limit} drafts (DRAFTS_PER_PASS is {DRAFTS_PER_PASS}; backend {backend!r} samples "
            f"{caps.max_sample_rows} rows of {caps.max_batch_tokens} tokens per chunk), got {drafts!r}: verify the "
            "rest in the next pass"
        )


def _check_drafts(drafts: int, n: int, samples: Sequence[SampleSpec], masked: bool) -> list[int]:
    """The sample (list position) verifying each row ``n - drafts - 1 .. n - 1``."""
    if not drafts:
        return []
    if not isinstance(drafts, int) or not 0 < drafts < n:
        raise InvalidInput(f"drafts must be an integer in [0, {n - 1}] (the pass holds {n} tokens), got {drafts!r}")
    if masked:
        raise InvalidInput("a pass with drafts cannot carry custom attention masks (drafts follow the causal order)")
    first: dict[int, int] = {}
    for i, s in enumerate(samples):
        first.setdefault(s.index, i)
    verifiers = []
    for row in range(n - drafts - 1, n):
        i = first.get(row)
        if i is None:
            raise InvalidInput(
                f"a pass with {drafts} drafts must sample every row from {n - drafts - 1} to {n - 1}; row {row} is not sampled"
            )
        if samples[i].draws != 1:
            raise InvalidInput(f"the sample verifying row {row} draws {samples[i].draws} tokens; drafts are verified with one draw")
        verifiers.append(i)
    return verifiers


def _check_limits(
    caps: Capabilities, backend: str, samples: Sequence[SampleSpec], n: int, masked: bool, base: int
) -> None:
    # The pass is cut into chunks of max_batch_tokens; each chunk must fit the backend's limits.
    if len(samples) > caps.max_sample_rows:
        per_chunk = np.bincount([s.index // caps.max_batch_tokens for s in samples])
        if per_chunk.max() > caps.max_sample_rows:
            raise InvalidInput(
                f"{per_chunk.max()} sampled rows in one chunk of {caps.max_batch_tokens} tokens; "
                f"backend {backend!r} takes at most {caps.max_sample_rows}: sample fewer rows per pass"
            )
    if masked and n * (base + n) > caps.max_mask_bytes:
        raise InvalidInput(
            f"a custom attention mask of {n} rows over {base + n} slots exceeds the backend's "
            f"{caps.max_mask_bytes} mask entries: run fewer tokens per masked pass"
        )


def _check_tokens(tokens: Sequence[int], vocab: int) -> np.ndarray:
    if len(tokens) == 1 and isinstance(tokens[0], (int, np.integer)) and 0 <= tokens[0] < vocab:
        return np.array(tokens, dtype=np.int32)  # the decode step: skip the vectorised checks
    try:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise InvalidInput("tokens must be a list of integers") from None
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if bad.size:
        i = int(bad[0])
        raise InvalidInput(f"token ids must be >= 0 and < {vocab}, got {int(ids[i])} at index {i}")
    return ids.astype(np.int32)


def _check_positions(positions: Sequence[int] | None, n: int, base: int, limit: int) -> np.ndarray:
    if n == 1 and (positions is None or len(positions) == 1):  # the decode step: no numpy checks
        p = base if positions is None else positions[0]
        if isinstance(p, (int, np.integer)) and 0 <= p < limit:
            return np.array([p], dtype=np.int32)
    if positions is None:
        pos = np.arange(base, base + n, dtype=np.int64)
    else:
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if len(pos) != n:
            raise InvalidInput(f"got {len(pos)} positions for {n} tokens; give one position per token")
    bad = np.flatnonzero((pos < 0) | (pos >= limit))
    if bad.size:
        i = int(bad[0])
        raise InvalidInput(f"positions must be >= 0 and < {limit}, got {int(pos[i])} at index {i}")
    if positions is not None and n > 1 and len(np.unique(pos)) != n:
        values, counts = np.unique(pos, return_counts=True)
        dup = int(values[counts > 1][0])
        raise InvalidInput(f"positions within one pass must be distinct; {dup} appears more than once")
    return pos.astype(np.int32)


def _check_rows(samples: Sequence[SampleSpec], probes: Sequence[ProbeSpec], n: int) -> None:
    for what, specs in (("sample", samples), ("probe", probes)):
        for spec in specs:
            if not 0 <= spec.index < n:
                raise InvalidInput(f"{what} index {spec.index} is outside this pass's {n} input tokens")
    for p in probes:
        if p.kind == ProbeKind.DISTRIBUTION and p.k < 0:
            raise InvalidInput(f"Distribution k must be >= 0, got {p.k}")


def _decode_masks(masks: Sequence[Sequence[int]], n: int, kv_len: int) -> np.ndarray:
    if len(masks) != n:
        raise InvalidInput(f"got {len(masks)} attention mask rows for {n} input tokens; give one per token")
    return np.stack([brle.decode(row, kv_len, f"attention mask row {i}") for i, row in enumerate(masks)])
