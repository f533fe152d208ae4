"""The adapters a cpu backend holds: mean tensors, scaling and zo sigma per id, fused for the forward.

Each adapter keeps its mean tensors as :mod:`pie_core.lora` names them and their fused per-layer
form (:func:`~pie_backend_cpu.lora_deltas.fuse`). A pass with zo seed ``s`` runs
:func:`pie_core.lora.perturbed` of the mean; those fused weights are cached per
``(adapter, seed)`` in a small LRU, dropped whenever the adapter is loaded, moved or destroyed.
Every method checks its arguments before changing anything, so a refused call leaves the
adapter as it was.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pie_core import lora
from pie_core.hookspec import ForwardBatch
from pie_core.models.spec import ModelSpec

from pie_backend_cpu.lora_deltas import LayerDeltas, TokenGroup, fuse, token_groups

__all__ = ["AdapterStore", "MAX_ADAPTERS", "MAX_ADAPTER_RANK", "PERTURBED_CACHE_SIZE"]

MAX_ADAPTERS = 32
"""Adapters held at once."""
MAX_ADAPTER_RANK = 64
"""Largest LoRA rank accepted."""
PERTURBED_CACHE_SIZE = 16
"""Perturbed ``(adapter, zo seed)`` weight sets kept between passes."""


@dataclass(slots=True)
class _Adapter:
    mean: dict[str, np.ndarray]
    scaling: float
    sigma: float
    layers: tuple[LayerDeltas, ...]


def _check_scaling(adapter_id: int, scaling: float) -> float:
    if not math.isfinite(scaling):
        raise ValueError(f"adapter {adapter_id}: scaling must be finite, got {scaling}")
    return float(scaling)


class AdapterStore:
    """Adapters of one loaded model, by the core's adapter id."""

    def __init__(self, spec: ModelSpec) -> None:
        self._spec = spec
        self._held: dict[int, _Adapter] = {}
        self._perturbed: OrderedDict[tuple[int, int], tuple[LayerDeltas, ...]] = OrderedDict()

    def create(self, adapter_id: int, rank: int, scaling: float) -> None:
        """Hold a zero adapter of ``rank`` over every target of every layer.

        Raises:
            ValueError: The id is negative or held, ``rank`` is outside ``[1, MAX_ADAPTER_RANK]``,
                ``scaling`` is not finite, or ``MAX_ADAPTERS`` are held.
        """
        if adapter_id < 0:
            raise ValueError(f"adapter ids are >= 0 (-1 means no adapter), got {adapter_id}")
        if adapter_id in self._held:
            raise ValueError(f"adapter {adapter_id} is held already; destroy it first")
        if not 1 <= rank <= MAX_ADAPTER_RANK:
            raise ValueError(f"adapter {adapter_id}: rank {rank} is outside [1, {MAX_ADAPTER_RANK}]")
        scaling = _check_scaling(adapter_id, scaling)
        if len(self._held) >= MAX_ADAPTERS:
            raise ValueError(f"adapter {adapter_id}: {MAX_ADAPTERS} adapters are held already; destroy one first")
        mean = {}
        for i in range(self._spec.num_layers):
            for target in lora.TARGETS:
                out, inp = lora.target_shape(self._spec, target)
                mean[lora.tensor_name(i, target, "a")] = np.zeros((rank, inp), dtype=np.float32)
                mean[lora.tensor_name(i, target, "b")] = np.zeros((out, rank), dtype=np.float32)
        self._held[adapter_id] = _Adapter(mean, scaling, 0.0, fuse(self._spec, mean, scaling))

    def load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        """Replace a held adapter's tensors and scaling (its zo sigma stays).

        Raises:
            ValueError: Unknown id, non-finite ``scaling``, or a tensor failing
                :func:`pie_core.lora.check_tensors`.
        """
        adapter = self._get(adapter_id)
        scaling = _check_scaling(adapter_id, scaling)
        try:
            lora.check_tensors(self._spec, tensors, MAX_ADAPTER_RANK)
        except ValueError as err:
            raise ValueError(f"adapter {adapter_id}: {err}") from None
        mean = {name: np.array(a, dtype=np.float32, copy=True) for name, a in tensors.items()}
        self._replace(adapter_id, _Adapter(mean, scaling, adapter.sigma, fuse(self._spec, mean, scaling)))

    def save(self, adapter_id: int) -> dict[str, np.ndarray]:
        """float32 copies of a held adapter's mean tensors, by name.

        Raises:
            ValueError: Unknown id.
        """
        return {name: a.copy() for name, a in self._get(adapter_id).mean.items()}

    def destroy(self, adapter_id: int) -> None:
        """Release a held adapter and its cached perturbed weights.

        Raises:
            ValueError: Unknown id.
        """
        self._get(adapter_id)
        self._drop_perturbed(adapter_id)
        del self._held[adapter_id]

    def zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        """Move the mean by ``sum_i coefficients[i] * zo_noise(seeds[i])`` (:func:`pie_core.lora.moved`)
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
        mean = adapter.mean
        layers = adapter.layers
        if seeds.size:
            mean = lora.moved(mean, seeds.astype(np.int64), coefficients.astype(np.float32))
            layers = fuse(self._spec, mean, adapter.scaling)
        self._replace(adapter_id, _Adapter(mean, adapter.scaling, float(sigma), layers))

    def groups(self, batch: ForwardBatch) -> tuple[TokenGroup, ...]:
        """The batch's adapter groups with the deltas each runs (empty when no request has one).

        Raises:
            ValueError: ``adapter_ids``/``zo_seeds`` do not have one entry per request, a request
                names an adapter not held, or has a nonzero zo seed without an adapter.
        """
        r = batch.num_requests
        ids, seeds = batch.adapter_ids, batch.zo_seeds
        if len(ids) != r or len(seeds) != r:
            raise ValueError(f"adapter_ids and zo_seeds need {r} entries, got {len(ids)} and {len(seeds)}")
        loose = np.flatnonzero((ids < 0) & (seeds != 0))
        if loose.size:
            bad = int(loose[0])
            raise ValueError(f"request {bad} has zo seed {int(seeds[bad])} but no adapter; zo perturbs an adapter")
        if (ids == -1).all():
            return ()
        unknown = np.flatnonzero((ids != -1) & ~np.isin(ids, list(self._held)))
        if unknown.size:
            bad = int(unknown[0])
            raise ValueError(f"request {bad} names adapter {int(ids[bad])}, which is not held")
        return tuple(TokenGroup(tokens, self._layers(a, s)) for a, s, tokens in token_groups(batch))

    def _layers(self, adapter_id: int, seed: int) -> tuple[LayerDeltas, ...]:
        adapter = self._held[adapter_id]
        if seed == 0 or adapter.sigma == 0.0:
            return adapter.layers
        key = (adapter_id, seed)
        layers = self._perturbed.get(key)
        if layers is None:
            layers = fuse(self._spec, lora.perturbed(adapter.mean, adapter.sigma, seed), adapter.scaling)
            self._perturbed[key] = layers
            if len(self._perturbed) > PERTURBED_CACHE_SIZE:
                self._perturbed.popitem(last=False)
        else:
            self._perturbed.move_to_end(key)
        return layers

    def _get(self, adapter_id: int) -> _Adapter:
        adapter = self._held.get(adapter_id)
        if adapter is None:
            raise ValueError(f"adapter {adapter_id} is not held; create it first")
        return adapter

    def _replace(self, adapter_id: int, adapter: _Adapter) -> None:
        self._drop_perturbed(adapter_id)
        self._held[adapter_id] = adapter

    def _drop_perturbed(self, adapter_id: int) -> None:
        for key in [k for k in self._perturbed if k[0] == adapter_id]:
            del self._perturbed[key]
