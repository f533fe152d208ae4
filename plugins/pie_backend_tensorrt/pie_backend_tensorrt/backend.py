"""``TensorrtBackend``: the hook implementations over one ONNX graph and its ONNX Runtime session.

Sampling and probes run on the host with the kit's reference samplers over the logits rows the
graph returns (only the rows a batch samples or probes are computed). Adapters are not offered.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Iterable

import numpy as np

from pie_core.backend_kit import (
    CONTRACT_VERSION,
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
    layer_frequencies,
    logit_rows,
    sample_and_probe,
    write_slots,
)

from pie_backend_tensorrt.export import exported_graph
from pie_backend_tensorrt.feed import Rope, build_feed
from pie_backend_tensorrt.kv_pages import KvPages, page_bytes
from pie_backend_tensorrt.options import MAX_BATCH_TOKENS, TrtConfig, resolve_options
from pie_backend_tensorrt.providers import VERIFIED, available, check_available
from pie_backend_tensorrt.session import GraphSession

__all__ = ["TensorrtBackend", "FEATURES", "MAX_BATCH_REQUESTS"]

FEATURES = frozenset({"custom_mask", "logit_mask", "probes", "embeddings", "offload"})
MAX_BATCH_REQUESTS = 256
MAX_SAMPLE_ROWS = 4096
MAX_MASK_BYTES = 1 << 26


def _package_version() -> str:
    try:
        return version("pie-backend-tensorrt")
    except PackageNotFoundError:
        return "0+unknown"


def _describe() -> str:
    have = available()
    if not have:
        return "ONNX Runtime is not installed: pip install 'pie-backend-tensorrt[gpu]' (or '[cpu]')"
    default = "TensorrtExecutionProvider" in have
    lines = [f"default provider tensorrt ({'available' if default else 'NOT available here: pass provider=cpu'})"]
    lines += [f"{p.removesuffix('ExecutionProvider')}: {'here' if p in have else 'absent'}, {VERIFIED[p]}" for p in VERIFIED]
    return "; ".join(lines)


class TensorrtBackend:
    """One ONNX graph per model, run by ONNX Runtime. One instance serves one model."""

    PIE_CONTRACT_VERSION = CONTRACT_VERSION

    def __init__(self) -> None:
        self._config: TrtConfig | None = None
        self._spec: ModelSpec | None = None
        self._session: GraphSession | None = None
        self._pages: KvPages | None = None
        self._rope: Rope | None = None
        self._caps: Capabilities | None = None
        self._rng = np.random.default_rng()

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        """Identify the backend (the description says which providers are here and verified)."""
        have = available()
        devices = ("cuda", "cpu") if {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(have) else ("cpu",)
        return BackendInfo(name="tensorrt", version=_package_version(), contract_version=CONTRACT_VERSION,
                           description=_describe(), features=FEATURES, devices=devices,
                           keeps_derived_weights=True)  # export.py: its graph under weights_key

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        """Export (or find cached) the model's graph, start its session and allocate the pools.

        The provider is checked before any weight is read.

        Raises:
            ValueError: An option is unknown, the provider is not available here (the message
                says what to install, or ``provider=cpu``), or a weight is missing or misshapen.
        """
        config = resolve_options(options, MAX_BATCH_REQUESTS)
        check_available(config)
        if options.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {options.page_size}")
        itemsize = 2 if config.dtype == "float16" else 4
        per_page = page_bytes(spec.num_layers, options.page_size, spec.num_kv_heads, spec.head_dim, itemsize)
        num_pages = device_pool_pages(options, per_page)
        host_pages = host_pool_pages(options)
        sliding = spec.sliding_window is not None and any(spec.is_sliding(i) for i in range(spec.num_layers))
        with exported_graph(spec, weights, config) as source:
            session = GraphSession(source, config, slots=num_pages * options.page_size, num_layers=spec.num_layers,
                                   kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, sliding=sliding)
        self._config, self._spec, self._session = config, spec, session
        self._pages = KvPages(session, num_pages, host_pages, options.page_size, spec.num_layers,
                              spec.num_kv_heads, spec.head_dim)
        self._rope = Rope(*layer_frequencies(spec), session.np_dtype)
        self._caps = Capabilities(
            page_size=options.page_size,
            num_pages=num_pages,
            num_host_pages=host_pages,
            vocab_size=spec.vocab_size,
            max_batch_tokens=MAX_BATCH_TOKENS,
            max_batch_requests=MAX_BATCH_REQUESTS,
            max_sample_rows=MAX_SAMPLE_ROWS,
            max_mask_bytes=MAX_MASK_BYTES,
            dtype=config.dtype,
            device="cpu" if config.provider == "cpu" else f"cuda:{config.device_id}",
            features=FEATURES,
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
        """Write K/V, attend, and sample/probe the requested rows.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: The batch is inconsistent or names an adapter (refused before any write).
        """
        caps = self.pie_backend_capabilities()
        assert self._session is not None and self._pages is not None and self._spec is not None
        assert self._rope is not None and self._config is not None
        caps.check_limits(batch)
        check_batch(batch, caps.vocab_size, caps.num_pages, caps.page_size)
        if (batch.adapter_ids >= 0).any() or (batch.zo_seeds != 0).any():
            raise ValueError("the tensorrt backend offers no adapters; this batch names one")
        slots = write_slots(batch, caps.page_size)
        rows, hidden = logit_rows(batch), hidden_rows(batch)
        pages = self._pages
        previous = pages.slot_pos[slots]
        pages.slot_pos[slots] = batch.positions
        try:
            feed = build_feed(batch, self._spec, self._rope, pages.slot_pos, slots, caps.page_size,
                              self._config.dtype, rows, hidden)
        except ValueError:
            pages.slot_pos[slots] = previous
            raise
        logits, states = self._session.run(feed)
        return sample_and_probe(batch, rows, logits, self._rng, states)

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole pages between or within the device and host pools.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: Lengths differ, ids are out of range, or destinations repeat.
        """
        self.pie_backend_capabilities()
        assert self._pages is not None
        self._pages.copy(kind, src, dst)
