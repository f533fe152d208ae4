"""``DummyBackend``: the contract without a model, for SDK tests and overhead benchmarks.

It needs no weights and keeps no KV. Logits are a deterministic function of each row's own
(token id, position): a fixed pseudo-random vocabulary row rotated by a hash of the pair, so
equal inputs give equal outputs in every run. Embeddings (EMBEDDING probes) are the same kind
of function: a fixed pseudo-random ``hidden_size`` row of unit RMS, rotated by that hash.
Sampling and probes follow the reference semantics of :mod:`pie_core.backend_kit.sampling`, so logit
masks, seeds and every sampler and probe kind behave exactly as on a real backend.
Adapters are held (created, loaded, saved, moved by zo, destroyed, refused when unknown) as the
contract says, but they do not change the logits: there are no weights to adapt.
Registered as the ``dummy`` entry point of ``pie.backends``.

Its compute takes almost no time, so to stand in for a real model in overhead benchmarks it can
be told how long work takes. Keys of ``BackendOptions.extra`` (``--backend-option KEY=VALUE`` on
``pie run`` and ``pie serve``), all optional, each a number >= 0 (default 0: no added time):

- ``step_ms``: milliseconds every forward batch sleeps (a fixed cost per step, like a GPU's);
- ``token_us``: microseconds added per input token of the batch (prefill and replays cost more);
- ``copy_us``: microseconds per page a ``pie_backend_copy_pages`` call sleeps (offload, restore).

The sleeps run inside the hooks, so on the engine's backend thread, as a real backend's compute
would: ``pie run --dummy --backend-option step_ms=10 --backend-option token_us=20 ...``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from pie_core.backend_kit.adapter_bank import AdapterBank, AdapterHooks
from pie_core.backend_kit.pools import device_pool_pages, host_pool_pages
from pie_core.backend_kit.sampling import hidden_rows, logit_rows, sample_and_probe
from pie_core.hookspec import (
    CONTRACT_VERSION,
    BackendInfo,
    BackendOptions,
    BatchOutput,
    Capabilities,
    CopyKind,
    ForwardBatch,
    SamplerKind,
    hookimpl,
)
from pie_core.models.spec import ModelSpec

__all__ = ["DummyBackend", "DummyTiming", "TIMING_OPTIONS", "dummy_logits", "dummy_embeddings", "page_bytes",
           "TOKEN_BYTES"]

_TABLE_SEED = 0x5EED


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _table(vocab_size: int) -> np.ndarray:
    """A fixed float32 row in [-4, 4), stored twice so every rotation is one slice."""
    row = np.random.Generator(np.random.PCG64(_TABLE_SEED)).uniform(-4.0, 4.0, vocab_size)
    return np.concatenate([row, row]).astype(np.float32)


def _offsets(token_ids: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    key = (token_ids.astype(np.uint64) << np.uint64(32)) ^ positions.astype(np.int64).astype(np.uint64)
    return (_mix(key) % np.uint64(width)).astype(np.int64)


def _rotations(table: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    width = table.shape[0] // 2
    out = np.empty((len(offsets), width), dtype=np.float32)
    for i, off in enumerate(offsets):
        out[i] = table[off : off + width]
    return out


def dummy_embeddings(table: np.ndarray, token_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The dummy's final hidden states for rows with the given token ids and positions.

    Args:
        table: ``_embedding_table(hidden_size)``, the doubled base row.
        token_ids: int ``[U]``.
        positions: int ``[U]``.

    Returns:
        float32 ``[U, hidden_size]``: the base row rotated by a hash of (token id, position).
    """
    return _rotations(table, _offsets(token_ids, positions, table.shape[0] // 2))


def _embedding_table(hidden_size: int) -> np.ndarray:
    """A fixed float32 row with unit root-mean-square (like a normed hidden state), doubled."""
    row = np.random.Generator(np.random.PCG64(_TABLE_SEED + 1)).standard_normal(hidden_size)
    row /= np.sqrt(np.mean(row**2))
    return np.concatenate([row, row]).astype(np.float32)


def dummy_logits(table: np.ndarray, token_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The dummy's logits for rows with the given token ids and positions.

    Args:
        table: ``_table(vocab)``, the doubled base row.
        token_ids: int ``[U]``.
        positions: int ``[U]``.

    Returns:
        float32 ``[U, vocab]``: the base row rotated by a hash of (token id, position).
    """
    return _rotations(table, _offsets(token_ids, positions, table.shape[0] // 2))


TOKEN_BYTES = 16 << 10
"""KV bytes per token the dummy pretends to hold (a small model's float32 K and V): its pool is
sized from ``kv_memory_bytes`` like a real backend's, and the default 1 GiB gives 4096 pages of 16."""


def page_bytes(page_size: int) -> int:
    """Bytes one dummy page pretends to take (it allocates none): :data:`TOKEN_BYTES` per token."""
    return TOKEN_BYTES * page_size


TIMING_OPTIONS = {
    "step_ms": "milliseconds per forward batch",
    "token_us": "microseconds per input token of a batch",
    "copy_us": "microseconds per copied page",
}
"""The dummy's backend options and what each one's number means."""


def _duration(key: str, value: Any) -> float:
    number = math.nan
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"dummy backend option {key}={value!r}: expected a number >= 0 ({TIMING_OPTIONS[key]}), "
                         f"e.g. --backend-option {key}=10")
    return number


@dataclass(frozen=True, slots=True)
class DummyTiming:
    """How long the dummy pretends its work takes (see the module docstring); all zero by default."""

    step_ms: float = 0.0
    token_us: float = 0.0
    copy_us: float = 0.0

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> DummyTiming:
        """The timing ``BackendOptions.extra`` asks for.

        Raises:
            ValueError: A key is not one of :data:`TIMING_OPTIONS`, or a value is not a number
                >= 0 (the message names the option).
        """
        unknown = sorted(set(extra) - set(TIMING_OPTIONS))
        if unknown:
            raise ValueError(f"unknown dummy backend option(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(TIMING_OPTIONS))}")
        return cls(**{key: _duration(key, extra[key]) for key in TIMING_OPTIONS if key in extra})

    def forward_s(self, num_tokens: int) -> float:
        """Seconds a forward batch of ``num_tokens`` input tokens sleeps."""
        return self.step_ms / 1e3 + self.token_us * num_tokens / 1e6


_FEATURES = frozenset({"custom_mask", "logit_mask", "probes", "embeddings", "offload", "adapters", "zo"})
MAX_ADAPTERS = 32
MAX_ADAPTER_RANK = 64


class DummyBackend(AdapterHooks):
    """Shape-correct backend with no model. One instance serves one (pretend) model."""

    PIE_CONTRACT_VERSION = CONTRACT_VERSION

    def __init__(self) -> None:
        self._caps: Capabilities | None = None
        self._table = np.zeros(0, dtype=np.float32)
        self._best = 0  # where the base row of the logits peaks
        self._hidden_table = np.zeros(0, dtype=np.float32)
        self._rng = np.random.default_rng()
        self._adapters: AdapterBank[None] | None = None
        self.timing = DummyTiming()

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        """Identify the backend."""
        return BackendInfo(
            name="dummy",
            version="0.1.0",
            contract_version=CONTRACT_VERSION,
            description="no model: deterministic pseudo-random logits, real samplers and probes",
            features=_FEATURES,
        )

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        """Take the vocabulary size from ``spec``; the weights are ignored (never read).

        The pools are sized as on a real backend (:func:`~pie_core.backend_kit.pools.device_pool_pages`:
        ``options.kv_pages``, or as many pages of :func:`page_bytes` as fit in
        ``options.kv_memory_bytes``; ``options.host_pages`` as
        :func:`~pie_core.backend_kit.pools.host_pool_pages` says), though they store nothing.

        ``options.extra`` may hold ``step_ms``, ``token_us`` and ``copy_us`` (see the module
        docstring); they are checked before anything else.

        Raises:
            ValueError: ``page_size`` or ``host_pages`` is out of range, ``options.extra`` names
                another option, or a timing option is not a number >= 0.
        """
        timing = DummyTiming.from_extra(options.extra)
        if options.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {options.page_size}")
        self.timing = timing
        self._adapters = AdapterBank(spec, lambda tensors, scaling: None, MAX_ADAPTERS, MAX_ADAPTER_RANK)
        self._table = _table(spec.vocab_size)
        self._best = int(np.argmax(self._table[: spec.vocab_size]))
        self._hidden_table = _embedding_table(spec.hidden_size)
        self._caps = Capabilities(
            page_size=options.page_size,
            num_pages=device_pool_pages(options, page_bytes(options.page_size)),
            num_host_pages=host_pool_pages(options),
            vocab_size=spec.vocab_size,
            max_batch_tokens=1 << 16,
            max_batch_requests=4096,
            max_sample_rows=1 << 16,
            max_mask_bytes=1 << 30,
            dtype="float32",
            device="cpu",
            features=_FEATURES,
            max_adapters=MAX_ADAPTERS,
            max_adapter_rank=MAX_ADAPTER_RANK,
        )
        return self._caps

    @hookimpl
    def pie_backend_capabilities(self) -> Capabilities:
        """Capabilities of the loaded (pretend) model.

        Raises:
            RuntimeError: No model is loaded yet.
        """
        return self._loaded()

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        """Sample and probe the requested rows from the dummy logits, after sleeping ``step_ms``
        plus ``token_us`` per input token (when set).

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: A sample/probe row, token id or page id is out of range.
        """
        caps = self._loaded()
        caps.check_limits(batch)
        n = batch.num_tokens
        rows = logit_rows(batch)
        if rows.size and (rows[0] < 0 or rows[-1] >= n):
            raise ValueError(f"sample and probe rows must index the {n} input tokens")
        if n and (batch.token_ids.min() < 0 or batch.token_ids.max() >= caps.vocab_size):
            raise ValueError(f"token ids must be in [0, {caps.vocab_size})")
        self._bank().check_batch(batch)
        pages = batch.kv_page_indices
        if pages.size and (pages.min() < 0 or pages.max() >= caps.num_pages):
            raise ValueError(f"kv_page_indices must be in [0, {caps.num_pages})")
        if pause := self.timing.forward_s(n):
            time.sleep(pause)  # the compute a real model would do here
        if self._greedy_only(batch):  # every row is argmax, unmasked, unprobed: no logits needed
            return BatchOutput(tokens=self._greedy(batch))
        logits = dummy_logits(self._table, batch.token_ids[rows], batch.positions[rows])
        hrows = hidden_rows(batch)
        if hrows.size and (hrows[0] < 0 or hrows[-1] >= n):
            raise ValueError(f"sample and probe rows must index the {n} input tokens")
        hidden = dummy_embeddings(self._hidden_table, batch.token_ids[hrows], batch.positions[hrows])
        return sample_and_probe(batch, rows, logits, self._rng, hidden)

    @staticmethod
    def _greedy_only(batch: ForwardBatch) -> bool:
        return (batch.logit_masks is None and len(batch.probe_rows) == 0
                and bool(np.all(np.asarray(batch.sampler_kind) == SamplerKind.ARGMAX)))

    def _greedy(self, batch: ForwardBatch) -> np.ndarray:
        """The argmax of each sample row's logits without making them: a row is the base row
        rotated by ``offset``, so its maximum sits ``offset`` places before the base row's (the
        base row's maximum is unique: its values are random floats)."""
        width = self._table.shape[0] // 2
        rows = np.asarray(batch.sample_rows)
        offsets = _offsets(batch.token_ids[rows], batch.positions[rows], width)
        best = (self._best - offsets) % width
        return np.repeat(best, np.asarray(batch.draws, dtype=np.int64)).astype(np.int32)

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Check the page ids of a copy (there is nothing to copy), then sleep ``copy_us`` per page.

        Raises:
            ValueError: Lengths differ or an id is out of range for its pool.
        """
        caps = self._loaded()
        kind = CopyKind(int(kind))
        if len(src) != len(dst):
            raise ValueError(
                f"copy_pages needs as many destinations as sources, got {len(src)} and {len(dst)}"
            )
        device, host = caps.num_pages, caps.num_host_pages
        limits = {
            CopyKind.DEVICE_TO_DEVICE: (device, device),
            CopyKind.DEVICE_TO_HOST: (device, host),
            CopyKind.HOST_TO_DEVICE: (host, device),
        }[kind]
        for ids, limit, what in ((src, limits[0], "source"), (dst, limits[1], "destination")):
            ids = np.asarray(ids)
            if ids.size and (ids.min() < 0 or ids.max() >= limit):
                raise ValueError(f"{what} page ids must be in [0, {limit}) for {kind.name}")
        if self.timing.copy_us and len(src):
            time.sleep(self.timing.copy_us * len(src) / 1e6)

    def _loaded(self) -> Capabilities:
        if self._caps is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._caps
