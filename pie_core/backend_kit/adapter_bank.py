"""What every backend keeps of its adapters: the contract's adapter hooks, checked, over mean
tensors, scaling and zo sigma per id, with each backend's own fused form.

A backend gives a ``fuse(tensors, scaling)`` that turns an adapter's tensors (as
:mod:`pie_core.backend_kit.lora` names them) into what its forward runs. :class:`AdapterBank` implements
``create / load / save / destroy / zo`` on top of it, checks a batch's ``adapter_ids`` and
``zo_seeds`` (:meth:`AdapterBank.check_batch`), and hands the forward the fused weights of an
``(adapter, zo seed)`` group (:meth:`AdapterBank.fused`): the mean's, or
:func:`pie_core.backend_kit.lora.perturbed` of it, cached per group in a small LRU that is dropped whenever the
adapter is loaded, moved or destroyed (subclasses with caches of their own extend
:meth:`AdapterBank.dropped`). Every method checks its arguments before changing anything, so a
refused call leaves the adapter as it was.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

import numpy as np

from pie_core.backend_kit import lora
from pie_core.hookspec import ForwardBatch, hookimpl
from pie_core.models.spec import ModelSpec

__all__ = ["AdapterBank", "AdapterHooks", "PERTURBED_CACHE_SIZE"]

PERTURBED_CACHE_SIZE = 16
"""Perturbed ``(adapter, zo seed)`` weight sets kept between passes."""

Fused = TypeVar("Fused")


@dataclass(slots=True)
class _Adapter(Generic[Fused]):
    mean: dict[str, np.ndarray]
    scaling: float
    sigma: float
    fused: Fused


def _check_scaling(adapter_id: int, scaling: float) -> float:
    if not math.isfinite(scaling):
        raise ValueError(f"adapter {adapter_id}: scaling must be finite, got {scaling}")
    return float(scaling)


class AdapterBank(Generic[Fused]):
    """Adapters of one loaded model, by the core's adapter id.

    Args:
        spec: The model.
        fuse: ``(tensors, scaling) -> Fused``, the backend's form of an adapter's weights.
        max_adapters: Adapters held at once.
        max_rank: Largest LoRA rank accepted.
    """

    def __init__(
        self, spec: ModelSpec, fuse: Callable[[dict[str, np.ndarray], float], Fused], max_adapters: int, max_rank: int
    ) -> None:
        self.spec = spec
        self.max_adapters = max_adapters
        self.max_rank = max_rank
        self._fuse = fuse
        self._held: dict[int, _Adapter[Fused]] = {}
        self._perturbed: OrderedDict[tuple[int, int], Fused] = OrderedDict()

    def create(self, adapter_id: int, rank: int, scaling: float) -> None:
        """Hold a zero adapter of ``rank`` over every target of every layer.

        Raises:
            ValueError: The id is negative or held, ``rank`` is outside ``[1, max_rank]``,
                ``scaling`` is not finite, or ``max_adapters`` are held.
        """
        if adapter_id < 0:
            raise ValueError(f"adapter ids are >= 0 (-1 means no adapter), got {adapter_id}")
        if adapter_id in self._held:
            raise ValueError(f"adapter {adapter_id} is held already; destroy it first")
        if not 1 <= rank <= self.max_rank:
            raise ValueError(f"adapter {adapter_id}: rank {rank} is outside [1, {self.max_rank}]")
        scaling = _check_scaling(adapter_id, scaling)
        if len(self._held) >= self.max_adapters:
            raise ValueError(f"adapter {adapter_id}: {self.max_adapters} adapters are held already; destroy one first")
        mean = {}
        for i in range(self.spec.num_layers):
            for target in lora.TARGETS:
                out, inp = lora.target_shape(self.spec, target)
                mean[lora.tensor_name(i, target, "a")] = np.zeros((rank, inp), dtype=np.float32)
                mean[lora.tensor_name(i, target, "b")] = np.zeros((out, rank), dtype=np.float32)
        self._held[adapter_id] = _Adapter(mean, scaling, 0.0, self._fuse(mean, scaling))

    def load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        """Replace a held adapter's tensors and scaling (its zo sigma stays).

        Raises:
            ValueError: Unknown id, non-finite ``scaling``, or a tensor failing
                :func:`pie_core.backend_kit.lora.check_tensors`.
        """
        adapter = self._get(adapter_id)
        scaling = _check_scaling(adapter_id, scaling)
        try:
            lora.check_tensors(self.spec, tensors, self.max_rank)
        except ValueError as err:
            raise ValueError(f"adapter {adapter_id}: {err}") from None
        mean = {name: np.array(a, dtype=np.float32, copy=True) for name, a in tensors.items()}
        self._replace(adapter_id, _Adapter(mean, scaling, adapter.sigma, self._fuse(mean, scaling)))

    def save(self, adapter_id: int) -> dict[str, np.ndarray]:
        """float32 copies of a held adapter's mean tensors, by name.

        Raises:
            ValueError: Unknown id.
        """
        return {name: a.copy() for name, a in self._get(adapter_id).mean.items()}

    def destroy(self, adapter_id: int) -> None:
        """Release a held adapter and everything cached for it.

        Raises:
            ValueError: Unknown id.
        """
        self._get(adapter_id)
        self.dropped(adapter_id)
        del self._held[adapter_id]

    def zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        """Move the mean by ``sum_i coefficients[i] * zo_noise(seeds[i])`` (:func:`pie_core.backend_kit.lora.moved`)
        and set the perturbation scale ``sigma``.

        Raises:
            ValueError: Unknown id, ``sigma`` not finite and >= 0, ``seeds`` and ``coefficients``
                not 1-D of one length, a seed that is zero or not an integer, or a non-finite
                coefficient.
        """
        adapter = self._get(adapter_id)
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"adapter {adapter_id}: sigma must be finite and >= 0, got {sigma}")
        seeds, coefficients = np.asarray(seeds), np.asarray(coefficients)
        if seeds.ndim != 1 or coefficients.ndim != 1 or len(seeds) != len(coefficients):
            raise ValueError(
                f"adapter {adapter_id}: seeds and coefficients must be 1-D of one length, "
                f"got shapes {seeds.shape} and {coefficients.shape}"
            )
        if seeds.size and (seeds.dtype.kind not in "iu" or (seeds == 0).any()):
            raise ValueError(f"adapter {adapter_id}: zo seeds must be nonzero int64, got {seeds.tolist()}")
        if not np.isfinite(coefficients).all():
            raise ValueError(f"adapter {adapter_id}: coefficients must be finite, got {coefficients.tolist()}")
        mean, fused = adapter.mean, adapter.fused
        if seeds.size:
            mean = lora.moved(mean, seeds.astype(np.int64), coefficients.astype(np.float32))
            fused = self._fuse(mean, adapter.scaling)
        self._replace(adapter_id, _Adapter(mean, adapter.scaling, float(sigma), fused))

    def check_batch(self, batch: ForwardBatch) -> bool:
        """Check the batch's adapter fields; True when some request has an adapter.

        Raises:
            ValueError: ``adapter_ids``/``zo_seeds`` do not have one entry per request, a request
                names an adapter not held, or has a nonzero zo seed without an adapter.
        """
        r = batch.num_requests
        ids, seeds = np.asarray(batch.adapter_ids), np.asarray(batch.zo_seeds)
        if ids.shape != (r,) or seeds.shape != (r,):
            raise ValueError(f"adapter_ids and zo_seeds need {r} entries, got shapes {ids.shape} and {seeds.shape}")
        loose = np.flatnonzero((ids < 0) & (seeds != 0))
        if loose.size:
            bad = int(loose[0])
            raise ValueError(f"request {bad} has zo seed {int(seeds[bad])} but no adapter; zo perturbs an adapter")
        if (ids == -1).all():
            return False
        unknown = np.flatnonzero((ids != -1) & ~np.isin(ids, list(self._held)))
        if unknown.size:
            bad = int(unknown[0])
            raise ValueError(f"request {bad} names adapter {int(ids[bad])}, which is not held; create it first")
        return True

    def fused(self, adapter_id: int, seed: int) -> Fused:
        """The fused weights a pass of a held adapter with zo seed ``seed`` (0 = none) runs."""
        adapter = self._held[adapter_id]
        if seed == 0 or adapter.sigma == 0.0:
            return adapter.fused
        key = (adapter_id, seed)
        fused = self._perturbed.get(key)
        if fused is None:
            fused = self._fuse(lora.perturbed(adapter.mean, adapter.sigma, seed), adapter.scaling)
            self._perturbed[key] = fused
            if len(self._perturbed) > PERTURBED_CACHE_SIZE:
                self._perturbed.popitem(last=False)
        else:
            self._perturbed.move_to_end(key)
        return fused

    def dropped(self, adapter_id: int) -> None:
        """Forget what is cached for ``adapter_id`` (its weights changed or it went)."""
        for key in [k for k in self._perturbed if k[0] == adapter_id]:
            del self._perturbed[key]

    def _get(self, adapter_id: int) -> _Adapter[Fused]:
        adapter = self._held.get(adapter_id)
        if adapter is None:
            raise ValueError(f"adapter {adapter_id} is not held; create it first")
        return adapter

    def _replace(self, adapter_id: int, adapter: _Adapter[Fused]) -> None:
        self.dropped(adapter_id)
        self._held[adapter_id] = adapter


class AdapterHooks:
    """The contract's adapter hookimpls for a backend whose ``_adapters`` is its
    :class:`AdapterBank` (None until a model is loaded). Mix it into the backend class."""

    _adapters: AdapterBank | None

    @hookimpl
    def pie_backend_adapter_create(self, adapter_id: int, rank: int, scaling: float) -> None:
        """Hold a new zero adapter of ``rank`` over every target of every layer.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: As :meth:`AdapterBank.create`.
        """
        self._bank().create(adapter_id, rank, scaling)

    @hookimpl
    def pie_backend_adapter_load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        """Replace a held adapter's tensors and scaling; what was cached for it is dropped.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: As :meth:`AdapterBank.load`; the adapter is unchanged.
        """
        self._bank().load(adapter_id, tensors, scaling)

    @hookimpl
    def pie_backend_adapter_save(self, adapter_id: int) -> dict[str, np.ndarray]:
        """float32 copies of a held adapter's mean tensors, by name.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: Unknown id.
        """
        return self._bank().save(adapter_id)

    @hookimpl
    def pie_backend_adapter_destroy(self, adapter_id: int) -> None:
        """Release a held adapter and everything cached for it.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: Unknown id.
        """
        self._bank().destroy(adapter_id)

    @hookimpl
    def pie_backend_adapter_zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        """Move a held adapter's mean (:func:`pie_core.backend_kit.lora.moved`) and set its zo ``sigma``.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: As :meth:`AdapterBank.zo`; nothing changes.
        """
        self._bank().zo(adapter_id, sigma, seeds, coefficients)

    def _bank(self) -> AdapterBank:
        if self._adapters is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._adapters
