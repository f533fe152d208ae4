"""The NumPy backend with one planted adapter or zo defect each: the adapter cases must fail them.

Each class is a complete backend (a ``CpuBackend`` subclass), passed to the suite as
``--pie-backend conformance_doubles:ClassName``. The defects: zo seeds ignored, one request's
zo seed applied to its whole batch, the LoRA scaling dropped, and noise that is Gaussian but not
the contract's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pie_backend_cpu import CpuBackend
from pie_core.hookspec import BatchOutput, ForwardBatch, hookimpl

__all__ = ["ZoIgnored", "ZoLeaks", "DropsScaling", "OwnNoise"]


class ZoIgnored(CpuBackend):
    """Runs every zo request on its adapter's mean."""

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        seeds = np.where(batch.adapter_ids >= 0, 0, batch.zo_seeds).astype(np.int64)
        return super().pie_backend_forward(dataclasses.replace(batch, zo_seeds=seeds))


class ZoLeaks(CpuBackend):
    """Gives every request of an adapter the first zo seed any of them carries."""

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        seeds = batch.zo_seeds.copy()
        for adapter_id in np.unique(batch.adapter_ids[batch.zo_seeds != 0]):
            same = batch.adapter_ids == adapter_id
            seeds[same] = seeds[same & (seeds != 0)][0]
        return super().pie_backend_forward(dataclasses.replace(batch, zo_seeds=seeds))


class DropsScaling(CpuBackend):
    """Applies ``B @ A`` without the adapter's scaling."""

    @hookimpl
    def pie_backend_adapter_create(self, adapter_id: int, rank: int, scaling: float) -> None:
        super().pie_backend_adapter_create(adapter_id=adapter_id, rank=rank, scaling=1.0)

    @hookimpl
    def pie_backend_adapter_load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        super().pie_backend_adapter_load(adapter_id=adapter_id, tensors=tensors, scaling=1.0)


class OwnNoise(CpuBackend):
    """Perturbs zo passes with its own seeded Gaussian noise instead of the contract's: a zo seed
    is replaced by another, so the draw is reproducible and differs per seed but is not the
    contract's noise for that seed."""

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        seeds = np.where(batch.zo_seeds != 0, batch.zo_seeds * 7919 + 1, 0).astype(np.int64)
        return super().pie_backend_forward(dataclasses.replace(batch, zo_seeds=seeds))
