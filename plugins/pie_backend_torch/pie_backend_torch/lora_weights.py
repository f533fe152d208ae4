"""LoRA adapters in the layout of the torch forward: one low-rank pair per fused projection.

The forward fuses Q/K/V into ``qkv`` and gate/up into ``gate_up`` (see
:mod:`pie_backend_torch.weights`), so an adapter is fused the same way: the ``A`` of its parts
stacked (``[parts * r, in]``), and its ``B`` (transposed, ``scaling`` folded in) in one of two
forms:

- *parts*, when the fused targets have equal widths (``gate_up``; ``qkv`` without GQA): one
  ``[r, width]`` block per target, zero (in ``A`` too) for a target the adapter lacks, so a delta
  reads no zero block of a block-diagonal ``B`` (half of it for ``gate_up``, whose ``B`` holds
  most of the bytes a decode step's deltas read);
- *block-diagonal* otherwise: ``[held * r, out]`` over the targets held, zero outside each
  target's columns.

A fused projection none of whose parts are held is None.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pie_core.backend_kit import ModelSpec, lora

__all__ = ["PROJECTIONS", "QKV", "ATTN_OUTPUT", "GATE_UP", "FFN_DOWN", "LowRank", "LayerLora", "fuse"]

_FUSED = (
    ("qkv", ("attn_q", "attn_k", "attn_v")),
    ("attn_output", ("attn_output",)),
    ("gate_up", ("ffn_gate", "ffn_up")),
    ("ffn_down", ("ffn_down",)),
)
"""Each projection of :class:`~pie_backend_torch.weights.LayerWeights` and the targets it fuses,
in output-row order."""

PROJECTIONS = tuple(name for name, _ in _FUSED)
"""The adapted projections, in the order :data:`LayerLora` holds them."""
QKV, ATTN_OUTPUT, GATE_UP, FFN_DOWN = range(len(PROJECTIONS))


@dataclass(frozen=True, slots=True)
class LowRank:
    """One fused projection's delta, in ``P`` parts of ``k`` ranks each.

    ``a`` ``[P * k, in]`` holds each part's ``A``; ``b`` ``[P, k, out / P]`` each part's
    ``(scaling * B).T``. A token's delta is ``u = a @ x``, then part by part
    ``u[p*k:(p+1)*k] @ b[p]`` for output columns ``p*out/P:(p+1)*out/P``. Both are on the device
    in the adapter compute dtype.
    """

    a: torch.Tensor
    b: torch.Tensor


LayerLora = tuple[LowRank | None, ...]
"""One layer's deltas, indexed by :data:`PROJECTIONS` (None: the projection adds nothing)."""


def _fuse_projection(
    spec: ModelSpec, tensors: dict[str, np.ndarray], layer: int, targets: tuple[str, ...], scaling: np.float32
) -> tuple[np.ndarray, np.ndarray] | None:
    held = [t for t in targets if lora.tensor_name(layer, t, "a") in tensors]
    if not held:
        return None
    rank = tensors[lora.tensor_name(layer, held[0], "a")].shape[0]
    inp = lora.target_shape(spec, targets[0])[1]
    outs = [lora.target_shape(spec, t)[0] for t in targets]
    if len(set(outs)) == 1:  # parts: every target its own block, zero when not held
        a = np.zeros((rank * len(targets), inp), dtype=np.float32)
        b = np.zeros((len(targets), rank, outs[0]), dtype=np.float32)
        for t in held:
            p = targets.index(t)
            a[p * rank : (p + 1) * rank] = tensors[lora.tensor_name(layer, t, "a")]
            b[p] = tensors[lora.tensor_name(layer, t, "b")].T * scaling
        return a, b
    starts = np.cumsum([0, *outs])
    b = np.zeros((1, rank * len(held), sum(outs)), dtype=np.float32)
    for j, t in enumerate(held):
        row = int(starts[targets.index(t)])
        block = tensors[lora.tensor_name(layer, t, "b")]
        b[0, j * rank : (j + 1) * rank, row : row + block.shape[0]] = block.T * scaling
    return np.concatenate([tensors[lora.tensor_name(layer, t, "a")] for t in held]), b


def fuse(
    spec: ModelSpec, tensors: dict[str, np.ndarray], scaling: float, dtype: torch.dtype, device: torch.device
) -> tuple[LayerLora, ...]:
    """Lay an adapter's tensors (checked with :func:`pie_core.backend_kit.lora.check_tensors`) out per layer
    and upload them.

    Returns:
        One :data:`LayerLora` per layer of ``spec``.
    """
    s = np.float32(scaling)
    layers = []
    for i in range(spec.num_layers):
        layer: list[LowRank | None] = []
        for _, targets in _FUSED:
            pair = _fuse_projection(spec, tensors, i, targets, s)
            layer.append(
                None
                if pair is None
                else LowRank(*(torch.from_numpy(a).to(device=device, dtype=dtype) for a in pair))
            )
        layers.append(tuple(layer))
    return tuple(layers)
