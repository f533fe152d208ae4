"""Backends declaring what the in-tree ones do not ('zo', 'adapters'), so the suite's cases for
those features run somewhere: ``ZoCpu`` implements them correctly, ``ZoIgnored`` declares zo but
never perturbs (the suite must fail it).

``ZoCpu`` keeps one NumPy backend per zo seed, its weights perturbed by seeded Gaussian noise;
each request runs on the backend of its seed, so K/V written by a zo request lives in that
backend's pool (enough for single-pass evaluations, which is how zo is used). It holds no
adapters: a batch naming one is refused, which is what the contract fixes today.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import numpy as np

from pie_backend_cpu import CpuBackend
from pie_core.hookspec import (
    BackendInfo,
    BackendOptions,
    BatchOutput,
    Capabilities,
    CopyKind,
    ForwardBatch,
    hookimpl,
)
from pie_core.models.spec import ModelSpec

__all__ = ["ZoCpu", "ZoIgnored", "ZoLeaks", "request_batch"]

_EXTRA = frozenset({"zo", "adapters"})


def request_batch(batch: ForwardBatch, r: int) -> ForwardBatch:
    """Request ``r`` of ``batch`` as a batch of its own (rows renumbered)."""
    a, b = int(batch.qo_indptr[r]), int(batch.qo_indptr[r + 1])
    pa, pb = int(batch.kv_page_indptr[r]), int(batch.kv_page_indptr[r + 1])
    ma, mb = int(batch.mask_indptr[r]), int(batch.mask_indptr[r + 1])
    s = np.flatnonzero((batch.sample_rows >= a) & (batch.sample_rows < b))
    q = np.flatnonzero((batch.probe_rows >= a) & (batch.probe_rows < b))
    new_index = np.full(len(batch.sample_rows) + 1, -1, dtype=np.int32)
    new_index[s] = np.arange(len(s))
    ids = [batch.probe_token_ids[batch.probe_token_indptr[i] : batch.probe_token_indptr[i + 1]] for i in q]
    i32 = np.int32
    return ForwardBatch(
        token_ids=batch.token_ids[a:b],
        positions=batch.positions[a:b],
        qo_indptr=np.array([0, b - a], dtype=i32),
        kv_page_indices=batch.kv_page_indices[pa:pb],
        kv_page_indptr=np.array([0, pb - pa], dtype=i32),
        kv_last_page_len=batch.kv_last_page_len[r : r + 1],
        kv_write_slots=batch.kv_write_slots[a:b],
        mask_indptr=np.array([0, mb - ma], dtype=np.int64),
        mask_data=batch.mask_data[ma:mb],
        sample_rows=(batch.sample_rows[s] - a).astype(i32),
        sampler_kind=batch.sampler_kind[s],
        temperature=batch.temperature[s],
        top_k=batch.top_k[s],
        top_p=batch.top_p[s],
        min_p=batch.min_p[s],
        draws=batch.draws[s],
        seeds=batch.seeds[s],
        logit_masks=None if batch.logit_masks is None else batch.logit_masks[s],
        probe_rows=(batch.probe_rows[q] - a).astype(i32),
        probe_kind=batch.probe_kind[q],
        probe_temperature=batch.probe_temperature[q],
        probe_k=batch.probe_k[q],
        probe_token_ids=np.concatenate(ids).astype(i32) if ids else np.zeros(0, dtype=i32),
        probe_token_indptr=np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(i32),
        probe_masked=new_index[batch.probe_masked[q]],
        adapter_ids=batch.adapter_ids[r : r + 1],
        zo_seeds=batch.zo_seeds[r : r + 1],
    )


class ZoCpu:
    """NumPy math with per-request zo perturbations (and no adapters, refusing any named)."""

    PIE_CONTRACT_VERSION = CpuBackend.PIE_CONTRACT_VERSION
    PERTURB = 0.05

    def __init__(self) -> None:
        self._base = CpuBackend()
        self._perturbed: dict[int, CpuBackend] = {}
        self._load: tuple[ModelSpec, list[tuple[str, np.ndarray]], BackendOptions] | None = None
        self._caps: Capabilities | None = None

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        info = self._base.pie_backend_info()
        return dataclasses.replace(info, name="zo-cpu", features=info.features | _EXTRA)

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        kept = list(weights)
        caps = self._base.pie_backend_load_model(spec, iter(kept), options)
        self._load = (spec, kept, options)
        self._caps = dataclasses.replace(caps, features=caps.features | _EXTRA)
        return self._caps

    @hookimpl
    def pie_backend_capabilities(self) -> Capabilities:
        assert self._caps is not None, "no model loaded"
        return self._caps

    def _backend(self, seed: int) -> CpuBackend:
        if seed == 0:
            return self._base
        if seed not in self._perturbed:
            assert self._load is not None, "no model loaded"
            spec, kept, options = self._load
            rng = np.random.default_rng(seed)
            noisy = [(n, w + (self.PERTURB * w.std() * rng.standard_normal(w.shape)).astype(np.float32))
                     for n, w in kept]
            backend = CpuBackend()
            backend.pie_backend_load_model(spec, iter(noisy), options)
            self._perturbed[seed] = backend
        return self._perturbed[seed]

    def zo_seed(self, seed: int) -> int:
        return seed

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        caps = self.pie_backend_capabilities()
        caps.check_limits(batch)
        if (batch.adapter_ids >= 0).any():
            raise ValueError(f"no adapter {int(batch.adapter_ids.max())} is loaded (this backend holds none)")
        if not batch.zo_seeds.any():
            return self._base.pie_backend_forward(batch)
        tokens: list[np.ndarray] = []
        probes: list[Any] = []
        for r in range(batch.num_requests):
            part = request_batch(batch, r)
            out = self._backend(self.zo_seed(int(batch.zo_seeds[r]))).pie_backend_forward(part)
            tokens.append(np.asarray(out.tokens))
            probes.extend(out.probes)
        return BatchOutput(tokens=np.concatenate(tokens).astype(np.int32), probes=tuple(probes))

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        for backend in (self._base, *self._perturbed.values()):
            backend.pie_backend_copy_pages(kind, src, dst)


class ZoIgnored(ZoCpu):
    """Declares 'zo' but runs every request on the unperturbed model."""

    def zo_seed(self, seed: int) -> int:
        return 0


class ZoLeaks(ZoCpu):
    """Perturbs the whole batch with the first zo seed any of its requests carries."""

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        seeds = batch.zo_seeds[batch.zo_seeds != 0]
        if seeds.size == 0:
            return super().pie_backend_forward(batch)
        return self._backend(int(seeds[0])).pie_backend_forward(batch)
