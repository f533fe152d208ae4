"""The adapters a torch backend holds: mean tensors, scaling and zo sigma per id, fused on the device.

Each adapter keeps its mean tensors as :mod:`pie_core.lora` names them (float32 NumPy, for save
and zo) and their fused per-layer device form (:func:`~pie_backend_torch.lora_weights.fuse`). A
pass with zo seed ``s`` runs :func:`pie_core.lora.perturbed` of the mean, drawn on the host and
uploaded once: those fused weights are cached per ``(adapter, seed)`` in a small LRU. The weights
of the groups a batch runs are stacked for the forward (:mod:`pie_backend_torch.lora_step`) and
cached by the tuple of groups, and the last batch's grouping is kept too: consecutive decode
steps mostly run the same requests. The caches drop what belongs to an adapter whenever it is
loaded, moved or destroyed. Every method checks its arguments before changing anything, so a
refused call leaves the adapter as it was.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from pie_core import lora
from pie_core.hookspec import ForwardBatch
from pie_core.models.spec import ModelSpec

from pie_backend_torch.lora_step import LoraStep, Stacked, stack
from pie_backend_torch.lora_weights import LayerLora, fuse

__all__ = ["AdapterStore", "MAX_ADAPTERS", "MAX_ADAPTER_RANK", "PERTURBED_CACHE_SIZE", "STACK_CACHE_SIZE"]

MAX_ADAPTERS = 32
"""Adapters held at once."""
MAX_ADAPTER_RANK = 64
"""Largest LoRA rank accepted."""
PERTURBED_CACHE_SIZE = 16
"""Perturbed ``(adapter, zo seed)`` weight sets kept between passes."""
STACK_CACHE_SIZE = 2
"""Stacked weights of this many group sets kept between passes (each a copy of its adapters)."""

_Group = tuple[int, int]  # (adapter id, zo seed)


@dataclass(slots=True)
class _Adapter:
    mean: dict[str, np.ndarray]
    scaling: float
    sigma: float
    layers: tuple[LayerLora, ...]


def _groups(ids: np.ndarray, seeds: np.ndarray) -> tuple[tuple[_Group, ...], np.ndarray]:
    """The distinct ``(id, seed)`` pairs, sorted, and each request's index among them."""
    order = np.lexsort((seeds, ids))
    a, s = ids[order], seeds[order]
    first = np.ones(len(a), dtype=bool)
    first[1:] = (a[1:] != a[:-1]) | (s[1:] != s[:-1])
    label = np.empty(len(a), dtype=np.int64)
    label[order] = np.cumsum(first) - 1
    return tuple(zip(a[first].tolist(), s[first].tolist())), label


def _check_scaling(adapter_id: int, scaling: float) -> float:
    if not math.isfinite(scaling):
        raise ValueError(f"adapter {adapter_id}: scaling must be finite, got {scaling}")
    return float(scaling)


class AdapterStore:
    """Adapters of one loaded model, by the core's adapter id.

    LoRA weights are kept in ``dtype``: float32 on a CPU (whatever the model's compute dtype:
    they are small, and oneDNN's float32 small matmuls are faster than its bf16 ones), the compute
    dtype on CUDA.
    """

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device) -> None:
        self._spec = spec
        self._dtype = dtype
        self._device = device
        self._held: dict[int, _Adapter] = {}
        self._perturbed: OrderedDict[_Group, tuple[LayerLora, ...]] = OrderedDict()
        self._stacks: OrderedDict[tuple[_Group, ...], tuple[tuple[Stacked | None, ...], ...]] = OrderedDict()
        self._last: tuple[tuple[bytes, bytes, bytes], LoraStep] | None = None

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
        self._held[adapter_id] = _Adapter(mean, scaling, 0.0, self._fuse(mean, scaling))

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
        self._drop_cached(adapter_id)
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
        mean, layers = adapter.mean, adapter.layers
        if seeds.size:
            mean = lora.moved(mean, seeds.astype(np.int64), coefficients.astype(np.float32))
            layers = self._fuse(mean, adapter.scaling)
        self._replace(adapter_id, _Adapter(mean, adapter.scaling, float(sigma), layers))

    def step(self, batch: ForwardBatch) -> LoraStep | None:
        """The deltas of the batch's adapter groups (None when no request has an adapter).

        Raises:
            ValueError: ``adapter_ids``/``zo_seeds`` do not have one entry per request, a request
                names an adapter not held, or has a nonzero zo seed without an adapter.
        """
        r = batch.num_requests
        ids, seeds = np.asarray(batch.adapter_ids), np.asarray(batch.zo_seeds)
        key = (ids.tobytes(), seeds.tobytes(), np.asarray(batch.qo_indptr).tobytes())
        if self._last is not None and self._last[0] == key:  # decode steps mostly repeat a batch's makeup
            return self._last[1]  # (checked when first seen; changing an adapter drops it)
        if ids.shape != (r,) or seeds.shape != (r,):
            raise ValueError(f"adapter_ids and zo_seeds need {r} entries, got shapes {ids.shape} and {seeds.shape}")
        loose = np.flatnonzero((ids < 0) & (seeds != 0))
        if loose.size:
            bad = int(loose[0])
            raise ValueError(f"request {bad} has zo seed {int(seeds[bad])} but no adapter; zo perturbs an adapter")
        held = ids >= 0
        if not held.any():
            return None
        unknown = np.flatnonzero((ids != -1) & ~np.isin(ids, list(self._held)))
        if unknown.size:
            bad = int(unknown[0])
            raise ValueError(f"request {bad} names adapter {int(ids[bad])}, which is not held; create it first")
        groups, label = _groups(ids[held].astype(np.int64), seeds[held].astype(np.int64))
        request_label = np.full(r, -1, dtype=np.int64)
        request_label[held] = label
        token_label = np.repeat(request_label, np.diff(batch.qo_indptr))
        step = LoraStep(token_label, self._stacked(groups), self._dtype, self._device)
        self._last = (key, step)
        return step

    def _stacked(self, groups: tuple[_Group, ...]) -> tuple[tuple[Stacked | None, ...], ...]:
        stacks = self._stacks.get(groups)
        if stacks is None:
            stacks = stack(tuple(self._layers(a, s) for a, s in groups))
            self._stacks[groups] = stacks
            if len(self._stacks) > STACK_CACHE_SIZE:
                self._stacks.popitem(last=False)
        else:
            self._stacks.move_to_end(groups)
        return stacks

    def _layers(self, adapter_id: int, seed: int) -> tuple[LayerLora, ...]:
        adapter = self._held[adapter_id]
        if seed == 0 or adapter.sigma == 0.0:
            return adapter.layers
        key = (adapter_id, seed)
        layers = self._perturbed.get(key)
        if layers is None:
            layers = self._fuse(lora.perturbed(adapter.mean, adapter.sigma, seed), adapter.scaling)
            self._perturbed[key] = layers
            if len(self._perturbed) > PERTURBED_CACHE_SIZE:
                self._perturbed.popitem(last=False)
        else:
            self._perturbed.move_to_end(key)
        return layers

    def _fuse(self, tensors: dict[str, np.ndarray], scaling: float) -> tuple[LayerLora, ...]:
        return fuse(self._spec, tensors, scaling, self._dtype, self._device)

    def _get(self, adapter_id: int) -> _Adapter:
        adapter = self._held.get(adapter_id)
        if adapter is None:
            raise ValueError(f"adapter {adapter_id} is not held; create it first")
        return adapter

    def _replace(self, adapter_id: int, adapter: _Adapter) -> None:
        self._drop_cached(adapter_id)
        self._held[adapter_id] = adapter

    def _drop_cached(self, adapter_id: int) -> None:
        self._last = None
        for key in [k for k in self._perturbed if k[0] == adapter_id]:
            del self._perturbed[key]
        for groups in [g for g in self._stacks if any(a == adapter_id for a, _ in g)]:
            del self._stacks[groups]
