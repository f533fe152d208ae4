"""``ExampleBackend``: every hook of the contract over the plain NumPy math of ``model.py``.

A real backend replaces ``model.py`` with its own kernels; everything else stays: say who you
are, load the weights and allocate pages, declare honestly what you can do, refuse what you did
not declare, run the batch, copy pages. This one declares less than the NumPy backend (no custom
attention masks, no offload, no embeddings, smaller batches) to show how declared capabilities
shape what the engine sends and what ``pie conformance`` checks. It needs nothing but
``pie-engine`` (and NumPy): sampling and probes come from ``pie_core.backend_kit``'s reference
implementations, which every backend must match.
"""

from __future__ import annotations

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
    ProbeKind,
    check_batch,
    device_pool_pages,
    hookimpl,
    logit_rows,
    sample_and_probe,
)

from pie_backend_example.model import Model

__all__ = ["ExampleBackend"]

FEATURES = frozenset({"logit_mask", "probes"})
"""What this backend promises. Custom masks, offload and embeddings are left out on purpose."""


class ExampleBackend:
    """One instance serves one model; Pie calls the hooks from one worker thread at a time."""

    PIE_CONTRACT_VERSION = CONTRACT_VERSION  # checked when the plugin is registered

    def __init__(self) -> None:
        self._model: Model | None = None  # stands in for your device kernels
        self._caps: Capabilities | None = None
        self._rng = np.random.default_rng()

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        """Who we are: shown by ``pie backends``; the contract version is checked at binding."""
        return BackendInfo(
            name="example",
            version="0.1.0",
            contract_version=CONTRACT_VERSION,
            description="example out-of-tree backend (NumPy math, narrower capabilities)",
            features=FEATURES,
        )

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        """Convert the weights, allocate the KV pages, and declare the capabilities.

        Raises:
            ValueError: A weight is missing or misshapen, the device/dtype is not cpu/float32,
                or an option was given (this backend takes none).
        """
        if options.extra:
            raise ValueError(f"unknown example backend option(s) {', '.join(sorted(options.extra))}: it takes none")
        if options.device != "cpu" or options.dtype not in ("float32", "auto"):
            raise ValueError(f"the example backend runs float32 on the cpu, not {options.dtype} on {options.device}")
        per_page = 2 * spec.num_layers * options.page_size * spec.num_kv_heads * spec.head_dim * 4  # K and V, float32
        num_pages = device_pool_pages(options, per_page)
        self._model = Model(spec, weights, num_pages, options.page_size)
        self._caps = Capabilities(
            page_size=options.page_size,
            num_pages=num_pages,
            num_host_pages=0,
            vocab_size=spec.vocab_size,
            max_batch_tokens=2048,
            max_batch_requests=64,
            max_sample_rows=2048,
            max_mask_bytes=0,
            dtype="float32",
            device="cpu",
            features=FEATURES,
        )
        return self._caps

    @hookimpl
    def pie_backend_capabilities(self) -> Capabilities:
        """The capabilities of the loaded model."""
        return self._loaded()

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        """Refuse what we did not declare, then write K/V, attend, sample and probe.

        Raises:
            ValueError: The batch exceeds a declared limit or needs an undeclared feature.
        """
        caps = self._loaded()
        caps.check_limits(batch)
        check_batch(batch, caps.vocab_size, caps.num_pages, caps.page_size)
        if int(batch.mask_indptr[-1]):
            raise ValueError("custom attention masks are not supported by the example backend")
        if (batch.probe_kind == ProbeKind.EMBEDDING).any():
            raise ValueError("EMBEDDING probes are not supported by the example backend")
        if (batch.adapter_ids >= 0).any() or batch.zo_seeds.any():
            raise ValueError("adapters and zo are not supported by the example backend")
        assert self._model is not None
        rows = logit_rows(batch)  # the tokens whose logits sampling and probes need
        return sample_and_probe(batch, rows, self._model.forward(batch, rows), self._rng)

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy device pages (forks); there is no host pool to copy to or from.

        Raises:
            ValueError: A host direction, or ids out of range.
        """
        self._loaded()
        if CopyKind(int(kind)) != CopyKind.DEVICE_TO_DEVICE:
            raise ValueError(f"{CopyKind(int(kind)).name} needs 'offload', which the example backend lacks")
        assert self._model is not None
        self._model.copy_pages(src, dst)

    def _loaded(self) -> Capabilities:
        if self._caps is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._caps
