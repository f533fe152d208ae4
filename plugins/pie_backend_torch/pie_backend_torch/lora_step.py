"""One forward's LoRA deltas: per adapted projection, one grouped op over every adapter group of
the batch (Punica's SGMV/BGMV).

The batch's tokens are grouped by ``(adapter, zo seed)`` once per step (:class:`LoraStep`), and
each projection's deltas ``out[t] += B_g A_g x[t]`` are added in one call of the kernel the
backend runs (:func:`lora_kernel`):

- ``native`` (a CPU where :mod:`pie_backend_torch.native` builds): ``pie_cpu::lora_add``
  (``csrc/lora.cpp``) takes the tokens group by group and each group's own weights, in the
  model's dtype (bfloat16, widened to float32 in registers, or float32); nothing is stacked or
  padded, so the groups may have any ranks;
- ``triton`` (CUDA, or ``kernels="triton"``): :func:`pie_backend_torch.triton_kernels.lora.lora_add`
  takes each token's group and the groups' weights stacked per projection (:func:`stack`, zero
  padded to the widest rank; cached by the adapter store), in the compute dtype;
- ``torch`` (the fallback where the native kernels do not build, and CUDA with
  ``kernels="torch"``): a loop over the groups, float32 weights on a CPU.

The native and Triton kernels accumulate in float32 and add the delta to the projection's output
in place, with one rounding to its dtype; the fallback rounds the delta, then adds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pie_backend_torch import native
from pie_backend_torch.lora_weights import PROJECTIONS, LayerLora, LowRank

__all__ = ["Stacked", "stack", "LoraStep", "lora_kernel"]


def lora_kernel(device: torch.device, kernels: str, dtype: torch.dtype) -> tuple[str, torch.dtype]:
    """The grouped LoRA kernel for a backend (``native``, ``triton`` or ``torch``) and the dtype
    it keeps the weights in (``dtype``: the model's compute dtype)."""
    if kernels == "triton":
        return "triton", dtype
    if device.type == "cpu":
        if native.ops() is None:
            return "torch", torch.float32  # torch's CPU bfloat16 matmuls are slower than its float32 ones
        return "native", torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    return "torch", dtype


@dataclass(frozen=True, slots=True)
class Stacked:
    """The groups holding one projection of one layer, their weights stacked, zero-padded to the
    widest rank ``k`` (for the Triton kernel)."""

    members: tuple[int, ...]  # group indices, in stacking order
    a: torch.Tensor  # [len(members), P * k, in]
    b: torch.Tensor  # [len(members), P, k, out / P]


def _stack_projection(groups: tuple[tuple[LayerLora, ...], ...], layer: int, projection: int) -> Stacked | None:
    members = tuple(g for g, layers in enumerate(groups) if layers[layer][projection] is not None)
    if not members:
        return None
    pairs = [p for p in (groups[g][layer][projection] for g in members) if p is not None]
    parts, inp, width = pairs[0].b.shape[0], pairs[0].a.shape[1], pairs[0].b.shape[2]
    k = max(p.b.shape[1] for p in pairs)
    a = pairs[0].a.new_zeros((len(members), parts * k, inp))
    b = pairs[0].b.new_zeros((len(members), parts, k, width))
    for j, p in enumerate(pairs):
        rank = p.b.shape[1]
        a[j].view(parts, k, inp)[:, :rank] = p.a.view(parts, rank, inp)
        b[j, :, :rank] = p.b
    return Stacked(members, a, b)


def stack(groups: tuple[tuple[LayerLora, ...], ...]) -> tuple[tuple[Stacked | None, ...], ...]:
    """Stack the weights of ``groups`` (each a per-layer :data:`LayerLora` tuple), per layer and
    projection."""
    return tuple(
        tuple(_stack_projection(groups, i, p) for p in range(len(PROJECTIONS))) for i in range(len(groups[0]))
    )


def _torch_add(pairs: tuple[LowRank | None, ...], tokens: torch.Tensor, indptr: np.ndarray, x: torch.Tensor,
               out: torch.Tensor) -> None:
    """The fallback: ``lora_add``'s arithmetic as torch ops, one group at a time."""
    for g, pair in enumerate(pairs):
        lo, hi = int(indptr[g]), int(indptr[g + 1])
        if pair is None or lo == hi:
            continue
        rows = tokens[lo:hi]
        parts, k = pair.b.shape[0], pair.b.shape[1]
        u = x.index_select(0, rows).to(pair.a.dtype) @ pair.a.T  # [n, P * k]
        y = torch.bmm(u.view(hi - lo, parts, k).transpose(0, 1), pair.b)  # [P, n, out / P]
        out.index_add_(0, rows, y.transpose(0, 1).reshape(hi - lo, -1).to(out.dtype))


class LoraStep:
    """The LoRA deltas of one forward: :meth:`add` them to each adapted projection's output."""

    def __init__(
        self,
        labels: np.ndarray,
        groups: tuple[tuple[LayerLora, ...], ...],
        kernel: str,
        device: torch.device,
        stacks: tuple[tuple[Stacked | None, ...], ...] | None = None,
    ) -> None:
        """
        Args:
            labels: int64 ``[N]``: each token's group (an index into ``groups``), -1 for tokens
                without an adapter.
            groups: Each group's weights, one :data:`LayerLora` per layer.
            kernel: As :func:`lora_kernel`.
            device: Where the weights and activations are.
            stacks: :func:`stack` of ``groups`` (the ``triton`` kernel's weights).
        """
        self.groups = groups
        self.kernel = kernel
        held = np.flatnonzero(labels >= 0)
        order = held[np.argsort(labels[held], kind="stable")]
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(labels[held], minlength=len(groups)))]).astype(np.int64)
        self.tokens = torch.from_numpy(order.astype(np.int64)).to(device)
        self._indptr = torch.from_numpy(self.indptr)  # the native op reads it on the host
        self._labels = labels
        self._device = device
        self._stacks = stacks
        self._args: dict[tuple[int, int], Any] = {}
        self._slots: dict[tuple[int, ...], torch.Tensor] = {}  # triton: each token's stacking slot, by members

    def add(self, layer: int, projection: int, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out[t] += B_g A_g x[t]`` for every token ``t`` of a group ``g`` holding
        ``projection`` of ``layer``.

        Args:
            layer: Decoder layer index.
            projection: Index into :data:`~pie_backend_torch.lora_weights.PROJECTIONS`.
            x: ``[N, in]``, the projection's input (any float dtype).
            out: ``[N, out]``, the projection's output, or a tensor it is added to (rows
                contiguous); updated in place.
        """
        args = self._args.get((layer, projection))
        if args is None:
            args = self._args[(layer, projection)] = self._prepare(layer, projection)
        if args is False:
            return
        if self.kernel == "native":
            native.ops().lora_add(x, out, *args, self.tokens, self._indptr)
        elif self.kernel == "triton":
            from pie_backend_torch.triton_kernels.lora import lora_add

            lora_add(x, out, *args)
        else:
            _torch_add(args, self.tokens, self.indptr, x, out)

    def _prepare(self, layer: int, projection: int) -> Any:
        """The kernel's arguments for one projection (False: no group holds it)."""
        pairs = tuple(g[layer][projection] for g in self.groups)
        if all(p is None for p in pairs):
            return False
        if self.kernel == "native":
            empty = torch.empty(0)
            return [empty if p is None else p.a for p in pairs], [empty if p is None else p.b for p in pairs]
        if self.kernel == "triton":
            assert self._stacks is not None
            s = self._stacks[layer][projection]
            assert s is not None
            index = self._slots.get(s.members)
            if index is None:
                slot = np.full(len(self.groups) + 1, -1, dtype=np.int64)  # index -1 (no group) stays -1
                slot[list(s.members)] = np.arange(len(s.members))
                index = self._slots[s.members] = torch.from_numpy(slot[self._labels]).to(self._device)
            return s.a, s.b, index
        return pairs
