"""The NumPy backend with one planted defect each: the suite must fail every one of them.

Each class is a complete backend (a ``CpuBackend`` subclass), passed to the suite as
``--pie-backend conformance_mutants:ClassName``. The defects are the ones real drivers have
shipped: a mask dropped on the way to the kernel, a position off by one, a logit mask ignored,
K/V written to the neighbouring page, a temperature never applied, a nucleus one token too wide,
a copy with source and destination swapped.

The ``Shared*`` mutants plant their defect in code the NumPy backend shares with others: they
patch a function of ``pie_core.backend_kit`` or of ``pie_backend_cpu`` itself, process-wide, when
the backend is made, as a bug in that shared code would be. A suite whose reference was the cpu
backend (or whose expected values came from ``pie_core.backend_kit.sampling``) ran the same
patched code on both sides and passed them; the float64 oracle and the cases' own definitions
must fail them. :data:`SHARED_BUGS` lists each patch as ``(module, attribute, replacement)``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Iterable

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
from pie_core.backend_kit import sampling as kit_sampling

__all__ = [
    "DropsAttentionMask",
    "OffByOnePosition",
    "IgnoresLogitMask",
    "WritesWrongPage",
    "IgnoresTemperature",
    "TopPKeepsOneTooMany",
    "CopiesBackwards",
    "SHARED_BUGS",
    "SharedRopeFrequencies",
    "SharedRmsNormCentred",
    "SharedTemperatureMultiplies",
    "SharedTiesToHigherId",
]

softmax = kit_sampling.softmax  # the correct one, bound before any Shared* mutant patches the kit


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


# -- defects in shared code -----------------------------------------------------------------------


def _rope_without_the_two(head_dim: int, theta: float, rope: Any) -> np.ndarray:
    """RoPE inverse frequencies with exponent ``i / head_dim`` instead of ``2i / head_dim``."""
    return 1.0 / theta ** (np.arange(head_dim // 2, dtype=np.float64) / head_dim)


def _centred_rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, axis: int = 0) -> np.ndarray:
    """RMSNorm that subtracts the mean first (a layer norm without bias)."""
    centred = x - x.mean(axis=axis, keepdims=True)
    return centred / np.sqrt(np.mean(np.square(centred), axis=axis, keepdims=True) + np.float32(eps)) * weight


_kit_softmax = kit_sampling.softmax


def _softmax_times_temperature(logits: np.ndarray, temperature: Any = 1.0, dtype: type = np.float64) -> np.ndarray:
    """``softmax(logits * T)``: right at temperature 1 only."""
    t = np.asarray(temperature, dtype=np.float64)
    return _kit_softmax(logits, 1.0 / t, dtype)


def _top_k_ids_higher_first(p: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` largest entries, higher ids winning ties at the cut."""
    order = np.lexsort((-np.arange(len(p)), -p))
    return np.sort(order[:k])


def _descending_higher_first(p: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return ids[np.lexsort((-ids, -p[ids]))]


SHARED_BUGS: dict[str, list[tuple[str, str, Callable[..., Any]]]] = {
    "SharedRopeFrequencies": [("pie_core.backend_kit.rope", "inverse_frequencies", _rope_without_the_two)],
    "SharedRmsNormCentred": [("pie_backend_cpu.model", "rms_norm", _centred_rms_norm)],
    "SharedTemperatureMultiplies": [("pie_core.backend_kit.sampling", "softmax", _softmax_times_temperature)],
    "SharedTiesToHigherId": [
        ("pie_core.backend_kit.sampling", "_top_k_ids", _top_k_ids_higher_first),
        ("pie_core.backend_kit.sampling", "_descending", _descending_higher_first),
    ],
}
"""Per shared-code mutant, the ``(module, attribute, replacement)`` patches it applies."""


class _SharedBug(CpuBackend):
    """The NumPy backend made after patching shared code (the patch stays for the process)."""

    def __init__(self) -> None:
        for module, attribute, replacement in SHARED_BUGS[type(self).__name__]:
            setattr(importlib.import_module(module), attribute, replacement)
        super().__init__()


class SharedRopeFrequencies(_SharedBug):
    """The kit's RoPE frequencies (cpu, torch and tensorrt all use them) miss the factor 2."""


class SharedRmsNormCentred(_SharedBug):
    """The cpu backend's RMSNorm subtracts the mean."""


class SharedTemperatureMultiplies(_SharedBug):
    """The kit's sampling softmax multiplies by the temperature instead of dividing."""


class SharedTiesToHigherId(_SharedBug):
    """The kit's top-k cut and distribution order let the higher id win ties."""
