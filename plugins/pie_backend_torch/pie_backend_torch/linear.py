"""Linear layers: dense weights, and weight-only int8 / int4 on torch's CPU kernels.

Every kind is called as ``layer(x)`` with ``x`` ``[tokens, in_features]`` and returns
``[tokens, out_features]`` in ``x``'s dtype. Quantised kinds use torch's own CPU kernels
(``aten._weight_int8pack_mm``: int8 per output channel; ``aten._weight_int4pack_mm_for_cpu``:
int4 in groups of 32 input features with a scale and an offset per group), which are fastest for
matrix-vector work; :class:`ByBatchSize` routes larger batches to dense weights.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["Linear", "Dense", "PackedDense", "dense", "Int8", "Int4", "ByBatchSize", "quantise", "fits_int4", "INT4_GROUP"]

INT4_GROUP = 32
_INT4_INNER_K_TILES = 2
_INT4_OUT_MULTIPLE = 16  # the CPU packing works on blocks of 16 output channels
_PACK_BATCH_HINT = 32  # oneDNN's blocking is chosen for this many rows; any count works


def fits_int4(weight: torch.Tensor) -> bool:
    """Whether the int4 CPU kernel takes a ``[out, in]`` weight of this shape."""
    return weight.shape[1] % INT4_GROUP == 0 and weight.shape[0] % _INT4_OUT_MULTIPLE == 0


class Linear(Protocol):
    """A linear map ``x @ W.T + b``."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class Dense:
    """Weights as they are, ``[out, in]`` in the compute dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.contiguous()
        self.bias = bias
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedDense:
    """bf16 weights pre-packed once into oneDNN's blocked layout (CPU): the same product as
    :class:`Dense` without re-laying the weight out on every call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous(), _PACK_BATCH_HINT)
        self.bias = None if bias is None else bias.to(torch.bfloat16)
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def dense(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> Linear:
    """The dense layer for ``dtype`` on the weight's device (pre-packed bf16 on a CPU with oneDNN)."""
    if weight.device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available():
        return PackedDense(weight, bias)
    return Dense(weight.to(dtype), None if bias is None else bias.to(dtype))


class Int8:
    """Weight-only int8: one bf16 scale per output channel (symmetric)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(torch.bfloat16)
        self.weight = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale
        self.bias = bias
        self.out_features = int(weight.shape[0])

    def dequantised(self) -> torch.Tensor:
        return self.weight.float() * self.scale.float()[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scale)
        return y if self.bias is None else y + self.bias


class Int4:
    """Weight-only int4 in groups of :data:`INT4_GROUP` inputs: ``w = (q - 8) * scale + zero``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        out, inp = weight.shape
        if not fits_int4(weight):
            raise ValueError(
                f"int4 needs in_features divisible by {INT4_GROUP} and out_features by {_INT4_OUT_MULTIPLE}, "
                f"got {inp} and {out}"
            )
        w = weight.float().reshape(out, inp // INT4_GROUP, INT4_GROUP)
        lo, hi = w.amin(dim=2), w.amax(dim=2)
        scale = ((hi - lo) / 15.0).clamp(min=1e-8).to(torch.bfloat16)
        zero = (lo + 8 * scale.float()).to(torch.bfloat16)
        q = torch.round((w - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp(0, 15)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).reshape(out, inp), _INT4_INNER_K_TILES
        )
        self.in_features = int(inp)
        # [in / group, out, 2]: (scale, zero) per group and output channel
        self.scales_and_zeros = torch.stack([scale, zero], dim=2).transpose(0, 1).contiguous()
        self.bias = bias
        self.out_features = int(out)

    def dequantised(self) -> torch.Tensor:
        """The effective ``[out, in]`` weight (read back through the kernel; for tests)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, INT4_GROUP, self.scales_and_zeros).float().T

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, INT4_GROUP, self.scales_and_zeros)
        return y if self.bias is None else y + self.bias


class ByBatchSize:
    """Quantised weights for small batches, dense ones for batches of more than ``max_tokens`` rows."""

    def __init__(self, small: Linear, large: Linear, max_tokens: int) -> None:
        self.small, self.large, self.max_tokens = small, large, max_tokens
        self.out_features = small.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.small(x) if x.shape[0] <= self.max_tokens else self.large(x)


def quantise(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    kind: str,
    dtype: torch.dtype,
    max_tokens: int,
) -> Linear:
    """A linear layer of ``kind`` (``"none"``, ``"int8"``, ``"int4"``) over float ``weight``.

    ``max_tokens > 0`` keeps a dense copy too, used for batches of more rows. int4 needs the input
    width to be a multiple of :data:`INT4_GROUP` and the output one of 16 (:func:`fits_int4`); other
    layers fall back to int8.
    """
    b = None if bias is None else bias.to(dtype)
    if kind == "none":
        return dense(weight, bias, dtype)
    if kind == "int4" and fits_int4(weight):
        small: Linear = Int4(weight, b)
    else:
        small = Int8(weight, b)
    if max_tokens <= 0:
        return small
    return ByBatchSize(small, dense(weight, bias, dtype), max_tokens)
