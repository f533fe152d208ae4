"""Linear layers: dense weights, and weight-only int8 / int4 on torch's CPU kernels.

Every kind is called as ``layer(x)`` with ``x`` ``[tokens, in_features]`` and returns
``[tokens, out_features]`` in ``x``'s dtype. Quantised kinds use torch's own CPU kernels
(``aten._weight_int8pack_mm``: int8 per output channel; ``aten._weight_int4pack_mm_for_cpu``:
int4 in groups of 32 input features with a scale and an offset per group), which are fastest for
matrix-vector work; :class:`ByBatchSize` routes larger batches to dense weights.
"""

from __future__ import annotations

from typing import Protocol, Self

import torch
import torch.nn.functional as F

__all__ = [
    "Linear",
    "Dense",
    "PackedDense",
    "dense",
    "Int8",
    "Int4",
    "ByBatchSize",
    "quantise",
    "fits_int4",
    "INT4_GROUP",
    "Int8Dynamic",
    "layer_tensors",
    "rebuild_layer",
]

INT4_GROUP = 32
_INT4_INNER_K_TILES = 2
_INT4_OUT_MULTIPLE = 16  # the CPU packing works on blocks of 16 output channels
_PACK_BATCH_HINT = 32
_OUTLIER_RATIO = 6.0
"""Int8Dynamic: input channels whose peak over the batch exceeds this many times the median
channel peak are multiplied in float32 (LLM.int8()'s decomposition): a few channels of the
residual stream carry values 10-50x the others and would crush every token's int8 step."""
_MAX_KEPT_COLUMNS = 64
"""Int8Dynamic keeps at most this many dequantised outlier columns per layer."""  # oneDNN's blocking is chosen for this many rows; any count works


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


def _per_channel_int8(weight: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 ``[out, in]`` weights and their per-output-channel scale (in ``scale_dtype``;
    the weights are rounded against that scale as stored)."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(scale_dtype)
    return torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8), scale


class _Int8Weights:
    """int8 weights with one scale per output channel; subclasses multiply."""

    SCALE_DTYPE = torch.float32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self._set(*_per_channel_int8(weight, self.SCALE_DTYPE), bias)

    @classmethod
    def from_quantised(cls, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> Self:
        """The layer over already quantised ``weight`` (int8 ``[out, in]``) and its ``scale``."""
        layer = cls.__new__(cls)
        layer._set(weight, scale, bias)
        return layer

    def _set(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.contiguous()
        self.scale = scale
        self.bias = bias
        self.out_features = int(weight.shape[0])

    def dequantised(self) -> torch.Tensor:
        return self.weight.float() * self.scale.float()[:, None]


class Int8(_Int8Weights):
    """Weight-only int8: one bf16 scale per output channel (symmetric)."""

    SCALE_DTYPE = torch.bfloat16

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
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).reshape(out, inp), _INT4_INNER_K_TILES)
        # [in / group, out, 2]: (scale, zero) per group and output channel
        self._set(packed, torch.stack([scale, zero], dim=2).transpose(0, 1).contiguous(), bias)

    @classmethod
    def from_packed(cls, packed: torch.Tensor, scales_and_zeros: torch.Tensor, bias: torch.Tensor | None) -> "Int4":
        """The layer over weights packed by an earlier :class:`Int4` (same torch version)."""
        layer = cls.__new__(cls)
        layer._set(packed, scales_and_zeros, bias)
        return layer

    def _set(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.packed = packed
        self.scales_and_zeros = scales_and_zeros
        self.in_features = int(scales_and_zeros.shape[0]) * INT4_GROUP
        self.bias = bias
        self.out_features = int(scales_and_zeros.shape[1])

    def dequantised(self) -> torch.Tensor:
        """The effective ``[out, in]`` weight (read back through the kernel; for tests)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, INT4_GROUP, self.scales_and_zeros).float().T

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, INT4_GROUP, self.scales_and_zeros)
        return y if self.bias is None else y + self.bias


class Int8Dynamic(_Int8Weights):
    """int8 weights (one scale per output channel) times int8 activations quantised per token on
    every call, multiplied by ``torch._int_mm`` (oneDNN's VNNI kernels on x86): 5-7x less CPU
    time than bf16 from 8 rows up on a CPU without AMX, where bf16 GEMMs are slow. Outlier input
    channels (see :data:`_OUTLIER_RATIO`) bypass the activation quantisation: their products use
    the dequantised weight columns."""

    def _set(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super()._set(weight, scale.float(), None if bias is None else bias.float())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32, copy=True)  # worked on in place below
        peaks = xf.abs().amax(dim=0)
        outliers = (peaks > _OUTLIER_RATIO * peaks.median()).nonzero().squeeze(1)
        wide = None
        if outliers.numel():
            wide = xf.index_select(1, outliers)
            xf.index_fill_(1, outliers, 0.0)
        step = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127.0)
        xq = xf.div_(step).round_().to(torch.int8)
        y = torch._int_mm(xq, self.weight.t()).mul(step * self.scale)  # int32 * float32 -> float32
        if wide is not None:
            cols = self.weight.index_select(1, outliers).float().mul_(self.scale[:, None])
            y.addmm_(wide, cols.t())
        if self.bias is not None:
            y.add_(self.bias)
        return y.to(x.dtype)


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
    large: str = "none",
) -> Linear:
    """A linear layer of ``kind`` (``"none"``, ``"int8"``, ``"int4"``, ``"w8a8"``) over float ``weight``.

    ``max_tokens > 0`` keeps a second layer for batches of more rows: dense weights (``large``
    ``"none"``) or :class:`Int8Dynamic` (``"w8a8"``). int4 needs the input width to be a multiple
    of :data:`INT4_GROUP` and the output one of 16 (:func:`fits_int4`); other layers fall back to
    int8.
    """
    b = None if bias is None else bias.to(dtype)
    if kind == "none":
        return dense(weight, bias, dtype)
    if kind == "w8a8":
        small: Linear = Int8Dynamic(weight, bias)
    elif kind == "int4" and fits_int4(weight):
        small = Int4(weight, b)
    else:
        small = Int8(weight, b)
    if max_tokens <= 0:
        return small
    big = Int8Dynamic(weight, bias) if large == "w8a8" else dense(weight, bias, dtype)
    return ByBatchSize(small, big, max_tokens)


def layer_tensors(layer: Linear, weight: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensors from which :func:`rebuild_layer` makes ``layer`` again without its float weight.

    Args:
        layer: What :func:`quantise` returned for ``weight``.
        weight: The float ``[out, in]`` weight it was built from (dense layers keep only a packed
            copy, so their tensor is this one in ``dtype``).
        dtype: The compute dtype.
    """
    if isinstance(layer, ByBatchSize):
        parts = {f"small.{k}": v for k, v in layer_tensors(layer.small, weight, dtype).items()}
        return parts | {f"large.{k}": v for k, v in layer_tensors(layer.large, weight, dtype).items()}
    bias = getattr(layer, "bias", None)
    if isinstance(layer, Int4):
        out = {"int4": layer.packed, "scales_and_zeros": layer.scales_and_zeros}
    elif isinstance(layer, Int8Dynamic):
        out = {"w8a8": layer.weight, "scale": layer.scale}
    elif isinstance(layer, Int8):
        out = {"int8": layer.weight, "scale": layer.scale}
    else:
        out = {"dense": weight.to(dtype)}
    return out if bias is None else out | {"bias": bias}


def rebuild_layer(tensors: dict[str, torch.Tensor], dtype: torch.dtype, max_tokens: int) -> Linear:
    """The layer that :func:`layer_tensors` described (``max_tokens`` as in :func:`quantise`).

    Raises:
        ValueError: The tensors describe no layer kind.
    """
    small = {k[6:]: v for k, v in tensors.items() if k.startswith("small.")}
    if small:
        large = {k[6:]: v for k, v in tensors.items() if k.startswith("large.")}
        return ByBatchSize(rebuild_layer(small, dtype, 0), rebuild_layer(large, dtype, 0), max_tokens)
    bias = tensors.get("bias")
    if "int4" in tensors:
        return Int4.from_packed(tensors["int4"], tensors["scales_and_zeros"], bias)
    if "w8a8" in tensors:
        return Int8Dynamic.from_quantised(tensors["w8a8"], tensors["scale"], bias)
    if "int8" in tensors:
        return Int8.from_quantised(tensors["int8"], tensors["scale"], bias)
    if "dense" in tensors:
        return dense(tensors["dense"], bias, dtype)
    raise ValueError(f"no linear layer in tensors {sorted(tensors)}")
