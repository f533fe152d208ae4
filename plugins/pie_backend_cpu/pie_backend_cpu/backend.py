"""``CpuBackend``: the hook implementations of the NumPy reference backend (adapters and zo
included; see ``adapters``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Iterable

import numpy as np

from pie_core.backend_kit import (
    CONTRACT_VERSION,
    AdapterHooks,
    BackendInfo,
    BackendOptions,
    BatchOutput,
    Capabilities,
    CopyKind,
    ForwardBatch,
    ModelSpec,
    check_batch,
    device_pool_pages,
    hidden_rows,
    hookimpl,
    host_pool_pages,
    logit_rows,
    sample_and_probe,
)

from pie_backend_cpu.adapters import MAX_ADAPTER_RANK, MAX_ADAPTERS, AdapterStore
from pie_backend_cpu.kv_store import KvStore, page_bytes
from pie_backend_cpu.model import Transformer
from pie_backend_cpu.weights import build_weights

__all__ = [
    "CpuBackend",
    "MAX_BATCH_TOKENS",
    "MAX_BATCH_REQUESTS",
    "MAX_SAMPLE_ROWS",
    "MAX_MASK_BYTES",
    "MAX_ADAPTERS",
    "MAX_ADAPTER_RANK",
]

MAX_BATCH_TOKENS = 8192
"""Most input tokens (prefill and decode together) in one forward."""
MAX_BATCH_REQUESTS = 256
"""Most requests in one forward."""
MAX_SAMPLE_ROWS = 4096
"""Most sample rows in one forward (each may draw several tokens)."""
MAX_MASK_BYTES = 1 << 28
"""Most custom attention-mask entries (one byte each, ``sum(n_r * kv_len_r)``) in one forward."""
FEATURES = frozenset({"custom_mask", "logit_mask", "probes", "embeddings", "adapters", "zo", "offload"})


def _package_version() -> str:
    try:
        return version("pie-backend-cpu")
    except PackageNotFoundError:
        return "0+unknown"


class CpuBackend(AdapterHooks):
    """Float32 NumPy backend: portable, simple, and the numerical oracle of the conformance suite.

    One instance serves one model. Hooks are called from one worker thread at a time.
    """

    PIE_CONTRACT_VERSION = CONTRACT_VERSION

    def __init__(self) -> None:
        self._model: Transformer | None = None
        self._store: KvStore | None = None
        self._caps: Capabilities | None = None
        self._adapters: AdapterStore | None = None
        self._rng = np.random.default_rng()

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        """Identify the backend."""
        return BackendInfo(
            name="cpu",
            version=_package_version(),
            contract_version=CONTRACT_VERSION,
            description="NumPy float32 reference backend (portable, single process)",
            features=FEATURES,
        )

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        """Load weights and allocate the KV pools.

        The pools are sized as :func:`~pie_core.backend_kit.device_pool_pages` and
        :func:`~pie_core.backend_kit.host_pool_pages` say (``kv_pages``, or as many pages as fit
        in ``kv_memory_bytes``; ``host_pages`` or the default). Pool memory is only committed as
        pages are first written.

        Raises:
            ValueError: A weight is missing or misshapen, the device/dtype is not cpu/float32,
                ``options.extra`` names any option (this backend takes none), or the pool options
                hold no page.
        """
        if options.extra:
            raise ValueError(
                f"unknown cpu backend option(s) {', '.join(sorted(options.extra))}: the cpu backend takes no "
                "--backend-option; drop it"
            )
        if options.device != "cpu":
            raise ValueError(f"the cpu backend runs on device 'cpu' only, not {options.device!r}")
        if options.dtype not in ("float32", "auto"):
            raise ValueError(f"the cpu backend computes in float32 only, not {options.dtype!r}; use --dtype float32 (or auto)")
        if options.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {options.page_size}")
        per_page = page_bytes(spec.num_layers, options.page_size, spec.num_kv_heads, spec.head_dim)
        num_pages = device_pool_pages(options, per_page)
        host_pages = host_pool_pages(options)
        model_weights = build_weights(spec, weights)
        self._store = KvStore(
            spec.num_layers, num_pages, host_pages, options.page_size, spec.num_kv_heads, spec.head_dim
        )
        self._model = Transformer(spec, model_weights, self._store)
        self._adapters = AdapterStore(spec)
        self._caps = Capabilities(
            page_size=options.page_size,
            num_pages=num_pages,
            num_host_pages=host_pages,
            vocab_size=spec.vocab_size,
            max_batch_tokens=MAX_BATCH_TOKENS,
            max_batch_requests=MAX_BATCH_REQUESTS,
            max_sample_rows=MAX_SAMPLE_ROWS,
            max_mask_bytes=MAX_MASK_BYTES,
            dtype="float32",
            device="cpu",
            features=FEATURES,
            max_adapters=MAX_ADAPTERS,
            max_adapter_rank=MAX_ADAPTER_RANK,
        )
        return self._caps

    @hookimpl
    def pie_backend_capabilities(self) -> Capabilities:
        """Capabilities of the loaded model.

        Raises:
            RuntimeError: No model is loaded yet.
        """
        if self._caps is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._caps

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        """Write K/V, attend, and sample/probe the requested rows (EMBEDDING probes read the
        final hidden state after the output norm). Requests with an adapter run its LoRA deltas,
        perturbed by their zo seed.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: The batch is inconsistent (lengths, ranges, slots, masks), names an
                adapter not held, or has a zo seed without an adapter (refused before any write).
        """
        model, caps = self._loaded()
        caps.check_limits(batch)
        check_batch(batch, caps.vocab_size, caps.num_pages, caps.page_size)
        assert self._adapters is not None
        adapters = self._adapters.groups(batch)
        rows = logit_rows(batch)
        logits, hidden = model.forward(batch, rows, hidden_rows(batch), adapters)
        return sample_and_probe(batch, rows, logits, self._rng, hidden)

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole pages between or within the device and host pools.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: Lengths differ, ids are out of range, or destinations repeat.
        """
        self._loaded()
        assert self._store is not None
        self._store.copy(kind, src, dst)

    def _loaded(self) -> tuple[Transformer, Capabilities]:
        if self._model is None or self._caps is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._model, self._caps
