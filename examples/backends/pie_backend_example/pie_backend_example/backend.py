"""``ExampleBackend``: every hook of the contract, with the numerics delegated to the NumPy backend.

A real backend replaces the delegation with its own kernels; everything else stays: say who you
are, load the weights and allocate pages, declare honestly what you can do, refuse what you did
not declare, run the batch, copy pages. This one declares less than the NumPy backend (no custom
attention masks, no offload, no embeddings, smaller batches) to show how declared capabilities
shape what the engine sends and what ``pie conformance`` checks.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from pie_backend_cpu import CpuBackend
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
    hookimpl,
)

__all__ = ["ExampleBackend"]

FEATURES = frozenset({"logit_mask", "probes"})
"""What this backend promises. Custom masks, offload and embeddings are left out on purpose."""


class ExampleBackend:
    """One instance serves one model; Pie calls the hooks from one worker thread at a time."""

    PIE_CONTRACT_VERSION = CONTRACT_VERSION  # checked when the plugin is registered

    def __init__(self) -> None:
        self._math = CpuBackend()  # stands in for your device kernels
        self._caps: Capabilities | None = None

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
            ValueError: A weight is missing or misshapen, or the device/dtype is not cpu/float32.
        """
        inner = self._math.pie_backend_load_model(spec, weights, options)
        self._caps = dataclasses.replace(
            inner,
            num_host_pages=0,
            max_batch_tokens=2048,
            max_batch_requests=64,
            max_sample_rows=2048,
            max_mask_bytes=0,
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
        if int(batch.mask_indptr[-1]):
            raise ValueError("custom attention masks are not supported by the example backend")
        if (batch.probe_kind == ProbeKind.EMBEDDING).any():
            raise ValueError("EMBEDDING probes are not supported by the example backend")
        return self._math.pie_backend_forward(batch)

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy device pages (forks); there is no host pool to copy to or from.

        Raises:
            ValueError: A host direction, or ids out of range.
        """
        self._loaded()
        if CopyKind(int(kind)) != CopyKind.DEVICE_TO_DEVICE:
            raise ValueError(f"{CopyKind(int(kind)).name} needs 'offload', which the example backend lacks")
        self._math.pie_backend_copy_pages(kind, src, dst)

    def _loaded(self) -> Capabilities:
        if self._caps is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._caps
