"""The adapters a torch backend holds (:class:`pie_core.backend_kit.AdapterBank`), fused on the
device by :func:`~pie_backend_torch.lora_weights.fuse`.

Perturbed zo weights are drawn on the host and uploaded once per ``(adapter, seed)``. The last
batch's grouping is kept (consecutive decode steps mostly run the same requests), and for the
Triton kernel the stacked weights of the last group sets
(:func:`~pie_backend_torch.lora_step.stack`). Both drop what belongs to an adapter whenever it is
loaded, moved or destroyed.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from pie_core.backend_kit import AdapterBank, ForwardBatch, ModelSpec

from pie_backend_torch.lora_step import LoraStep, Stacked, lora_kernel, stack
from pie_backend_torch.lora_weights import LayerLora, fuse
from pie_backend_torch.tp_shard import Shard, local_spec

__all__ = ["AdapterStore", "MAX_ADAPTERS", "MAX_ADAPTER_RANK", "STACK_CACHE_SIZE"]

MAX_ADAPTERS = 32
"""Adapters held at once."""
MAX_ADAPTER_RANK = 64
"""Largest LoRA rank accepted."""
STACK_CACHE_SIZE = 2
"""Triton: stacked weights of this many group sets kept between passes (each a copy of its adapters)."""

_Group = tuple[int, int]  # (adapter id, zo seed)


def _groups(ids: np.ndarray, seeds: np.ndarray) -> tuple[tuple[_Group, ...], np.ndarray]:
    """The distinct ``(id, seed)`` pairs, sorted, and each request's index among them."""
    order = np.lexsort((seeds, ids))
    a, s = ids[order], seeds[order]
    first = np.ones(len(a), dtype=bool)
    first[1:] = (a[1:] != a[:-1]) | (s[1:] != s[:-1])
    label = np.empty(len(a), dtype=np.int64)
    label[order] = np.cumsum(first) - 1
    return tuple(zip(a[first].tolist(), s[first].tolist())), label


class AdapterStore(AdapterBank[tuple[LayerLora, ...]]):
    """Adapters of one loaded model, by the core's adapter id (``shard``: this tensor-parallel
    rank's slice of each, :meth:`~pie_backend_torch.tp_shard.Shard.take_adapter`).

    ``kernels`` and ``dtype`` are the backend's; the store keeps LoRA weights in the dtype of
    the grouped kernel that runs them (:func:`~pie_backend_torch.lora_step.lora_kernel`).
    """

    def __init__(
        self, spec: ModelSpec, kernels: str, dtype: torch.dtype, device: torch.device, shard: Shard | None = None
    ) -> None:
        self._kernel, dtype = lora_kernel(device, kernels, dtype)
        if shard is None:
            super().__init__(spec, lambda tensors, scaling: fuse(spec, tensors, scaling, dtype, device),
                             MAX_ADAPTERS, MAX_ADAPTER_RANK)
        else:  # every rank holds the whole adapter and fuses its own slice of it
            part = local_spec(spec, shard.tp)
            super().__init__(
                spec,
                lambda tensors, scaling: fuse(part, shard.take_adapter(tensors), scaling, dtype, device),
                MAX_ADAPTERS,
                MAX_ADAPTER_RANK,
            )
        self._device = device
        self._stacks: OrderedDict[tuple[_Group, ...], tuple[tuple[Stacked | None, ...], ...]] = OrderedDict()
        self._last: tuple[tuple[bytes, bytes, bytes], LoraStep] | None = None

    def step(self, batch: ForwardBatch) -> LoraStep | None:
        """The deltas of the batch's adapter groups (None when no request has an adapter).

        Raises:
            ValueError: As :meth:`~pie_core.backend_kit.AdapterBank.check_batch`.
        """
        r = batch.num_requests
        ids, seeds = np.asarray(batch.adapter_ids), np.asarray(batch.zo_seeds)
        key = (ids.tobytes(), seeds.tobytes(), np.asarray(batch.qo_indptr).tobytes())
        if self._last is not None and self._last[0] == key:  # decode steps mostly repeat a batch's makeup
            return self._last[1]  # (checked when first seen; changing an adapter drops it)
        if not self.check_batch(batch):
            return None
        held = ids >= 0
        groups, label = _groups(ids[held].astype(np.int64), seeds[held].astype(np.int64))
        request_label = np.full(r, -1, dtype=np.int64)
        request_label[held] = label
        token_label = np.repeat(request_label, np.diff(batch.qo_indptr))
        fused = tuple(self.fused(a, s) for a, s in groups)
        stacks = self._stacked(groups, fused) if self._kernel == "triton" else None
        step = LoraStep(token_label, fused, self._kernel, self._device, stacks)
        self._last = (key, step)
        return step

    def _stacked(
        self, groups: tuple[_Group, ...], fused: tuple[tuple[LayerLora, ...], ...]
    ) -> tuple[tuple[Stacked | None, ...], ...]:
        stacks = self._stacks.get(groups)
        if stacks is None:
            stacks = stack(fused)
            self._stacks[groups] = stacks
            if len(self._stacks) > STACK_CACHE_SIZE:
                self._stacks.popitem(last=False)
        else:
            self._stacks.move_to_end(groups)
        return stacks

    def dropped(self, adapter_id: int) -> None:
        """Forget the perturbed, stacked and last-batch weights that involve ``adapter_id``."""
        super().dropped(adapter_id)
        self._last = None
        for groups in [g for g in self._stacks if any(a == adapter_id for a, _ in g)]:
            del self._stacks[groups]
