"""The NumPy backend with one planted defect each: the suite must fail every one of them.

Each class is a complete backend (a ``CpuBackend`` subclass), passed to the suite as
``--pie-backend conformance_mutants:ClassName``. The defects are the ones real drivers have
shipped: a mask dropped on the way to the kernel, a position off by one, a logit mask ignored,
K/V written to the neighbouring page, a temperature never applied, a nucleus one token too wide,
a copy with source and destination swapped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import numpy as np

from pie_backend_cpu import CpuBackend
from pie_core.hookspec import (
    BackendOptions,
    BatchOutput,
    Capabilities,
    CopyKind,
    ForwardBatch,
    ProbeKind,
    SamplerKind,
    hookimpl,
)
from pie_core.models.spec import ModelSpec
from pie_core.backend_kit.sampling import softmax

__all__ = [
    "DropsAttentionMask",
    "OffByOnePosition",
    "IgnoresLogitMask",
    "WritesWrongPage",
    "IgnoresTemperature",
    "TopPKeepsOneTooMany",
    "CopiesBackwards",
]


class _BatchMutant(CpuBackend):
    """Rewrites each batch before the correct backend sees it."""

    def mutate(self, batch: ForwardBatch) -> ForwardBatch:
        raise NotImplementedError

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        return super().pie_backend_forward(self.mutate(batch))


class DropsAttentionMask(_BatchMutant):
    """Custom masks never reach attention: every request runs causal."""

    def mutate(self, batch: ForwardBatch) -> ForwardBatch:
        return dataclasses.replace(
            batch, mask_indptr=np.zeros_like(batch.mask_indptr), mask_data=np.zeros(0, dtype=bool)
        )


class OffByOnePosition(_BatchMutant):
    """The last input token of each request is rotated as if one position later."""

    def mutate(self, batch: ForwardBatch) -> ForwardBatch:
        positions = batch.positions.copy()
        positions[batch.qo_indptr[1:] - 1] += 1
        return dataclasses.replace(batch, positions=positions)


class IgnoresLogitMask(_BatchMutant):
    """Logit masks are dropped before sampling and probing."""

    def mutate(self, batch: ForwardBatch) -> ForwardBatch:
        return dataclasses.replace(batch, logit_masks=None)


class IgnoresTemperature(_BatchMutant):
    """Every sampler runs at temperature 1."""

    def mutate(self, batch: ForwardBatch) -> ForwardBatch:
        return dataclasses.replace(batch, temperature=np.ones_like(batch.temperature))


class WritesWrongPage(CpuBackend):
    """K/V of the last slot of every page lands in the next physical page."""

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        caps = super().pie_backend_load_model(spec, weights, options)
        store: Any = self._store
        write, last = store.write, caps.page_size - 1

        def wrong_page(layer: int, pages: np.ndarray, offsets: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
            write(layer, np.where(offsets == last, (pages + 1) % caps.num_pages, pages), offsets, k, v)

        store.write = wrong_page
        return caps


class TopPKeepsOneTooMany(CpuBackend):
    """Top-p keeps the nucleus plus the next most probable token."""

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        rows = np.flatnonzero((batch.sampler_kind == SamplerKind.TOP_P) & (batch.temperature > 0))
        if rows.size == 0:
            return super().pie_backend_forward(batch)
        q = len(rows)
        peek = dataclasses.replace(  # read the rows' logits first (the K/V writes repeat identically)
            batch,
            probe_rows=batch.sample_rows[rows],
            probe_kind=np.full(q, ProbeKind.LOGITS, dtype=np.int8),
            probe_temperature=np.ones(q, dtype=np.float32),
            probe_k=np.zeros(q, dtype=np.int32),
            probe_token_ids=np.zeros(0, dtype=np.int32),
            probe_token_indptr=np.zeros(q + 1, dtype=np.int32),
            probe_masked=rows.astype(np.int32) if batch.logit_masks is not None else np.full(q, -1, np.int32),
        )
        logits = np.stack(super().pie_backend_forward(peek).probes)
        kind, top_k = batch.sampler_kind.copy(), batch.top_k.copy()
        for j, s in enumerate(rows):
            p = np.sort(softmax(logits[j], float(batch.temperature[s])))[::-1]
            nucleus = int(np.searchsorted(np.cumsum(p), batch.top_p[s] * p.sum(), side="left")) + 1
            kind[s], top_k[s] = SamplerKind.TOP_K, min(nucleus + 1, len(p))
        return super().pie_backend_forward(dataclasses.replace(batch, sampler_kind=kind, top_k=top_k))


class CopiesBackwards(CpuBackend):
    """``copy_pages`` copies from the destination onto the source."""

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        super().pie_backend_copy_pages(kind, dst, src)
