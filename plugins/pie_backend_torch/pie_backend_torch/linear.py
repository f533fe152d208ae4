"""Linear layers: dense weights, weight-only int8 / int4 on torch's CPU kernels, int8 x int8
(w8a8), and 4-bit (q4) or 8-bit (q8) weights times int8 activations on the backend's own kernels;
``fit`` picks per tensor the narrowest of q4, q8 and float32 that holds its values.

Every kind is called as ``layer(x)`` with ``x`` ``[tokens, in_features]`` and returns
``[tokens, out_features]`` in ``x``'s dtype. Quantised kinds use torch's own CPU kernels
(``aten._weight_int8pack_mm``: int8 per output channel; ``aten._weight_int4pack_mm_for_cpu``:
int4 in groups of 32 input features with a scale and an offset per group), which are fastest for
matrix-vector work; :class:`Q4` and :class:`Q8` run ``csrc/q4.cpp`` (built on first use, :mod:`.native`);
:class:`ByBatchSize` routes larger batches to other weights.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Protocol, Self

import numpy as np
import torch
import torch.nn.functional as F

from pie_backend_torch import native, q5
from pie_backend_torch.options import cpu_has_bf16

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
    "Q4",
    "Q8",
    "Q5",
    "fit",
    "refine",
    "layer_tensors",
    "rebuild_layer",
]

INT4_GROUP = 32
_INT4_INNER_K_TILES = 2
_INT4_OUT_MULTIPLE = 16  # the CPU packing works on blocks of 16 output channels
_PACK_BATCH_HINT = 32
_OUTLIER_CHANNELS = 8
"""Int8Dynamic: the input channels of largest magnitude over the batch (this many) are taken out
of the int8 step and multiplied in float32 (LLM.int8()'s decomposition, with a fixed count rather
than a threshold: no data-dependent shapes, and no harm when there are fewer outliers). A few
channels of Qwen2.5's residual stream carry values 10-50x the others and would crush every
token's int8 step (docs/performance.md has the accuracy with and without)."""
_KEPT_COLUMNS = 32
"""Int8Dynamic keeps the dequantised weights of up to this many outlier channels per layer (the
same channels come back step after step); a new channel past that starts the set afresh."""


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
        # in the weight's dtype: a quantised format's large-batch layers get float32 activations
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 ``[len(ids), in]``: the weight rows ``ids`` (a tied embedding's lookup)."""
        return F.embedding(ids, self.weight).float()


class PackedDense:
    """bf16 weights pre-packed once into oneDNN's blocked layout (CPU): the same product as
    :class:`Dense` without re-laying the weight out on every call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous(), _PACK_BATCH_HINT)
        self.bias = None if bias is None else bias.to(torch.bfloat16)
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.weight, self.bias, "none", [], "")
        return y.to(x.dtype)  # q4's large-batch layers get float32 activations (it crashed on them)


def dense(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> Linear:
    """The dense layer for ``dtype`` on the weight's device (pre-packed bf16 on a CPU with native bf16)."""
    if weight.device.type == "cpu" and dtype == torch.bfloat16 and cpu_has_bf16():
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


class _TwoSteps:
    """The native int8-activation layers (q4, q8, q5). ``fine`` layers take their activations in two
    int8 steps, the row's blocks and then the blocks of what those missed (about 15 bits, in the
    kernel: twice the rows, summed per row, so a row's result still depends on that row alone).
    Under quant ``fit`` the layers whose inputs carry outlier channels (the attention's Q/K/V
    projection and the MLP's down projection) are fine: nearly all of the default model's loss
    against float32 came from their int8 activations (docs/performance.md); fine everywhere costs
    twice the multiply work for +0.1% perplexity less."""

    fine = False
    op: Callable[..., torch.Tensor]
    packed: torch.Tensor
    out_features: int
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self.packed, self.out_features, self.bias, self.fine)


class Q4(_TwoSteps):
    """4-bit weights in blocks of 32 inputs (``w = q * scale + low``, float16 scale and low) times
    activations quantised to int8 per block of 32 on every call, on the backend's own kernel
    (:func:`pie_backend_torch.native.ops`; VNNI or AVX2 integer dot products). float32 in and out:
    the per-block activation scale needs no outlier split."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self._set(native.pack_q4(weight), int(weight.shape[1]), int(weight.shape[0]), bias)

    @classmethod
    def from_packed(cls, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> "Q4":
        """The layer over ``out_features`` rows packed by :func:`pie_backend_torch.native.pack_q4`."""
        layer = cls.__new__(cls)
        layer._set(packed, native.q4_in_features(packed.shape[1]), out_features, bias)
        return layer

    def _set(self, packed: torch.Tensor, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        if -(-out_features // native.Q4_GROUP) != packed.shape[0]:
            raise ValueError(f"{packed.shape[0]} packed q4 groups cannot hold {out_features} rows")
        self.op = native.require_q4().q4_linear
        self.packed = packed
        self.in_features = in_features
        self.out_features = out_features
        self.bias = None if bias is None else bias.float()

    def dequantised(self) -> torch.Tensor:
        """The effective float32 ``[out, in]`` weight (for tests)."""
        return native.unpack_q4(self.packed, self.in_features, self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 ``[len(ids), in]``: the weight rows ``ids`` (a tied embedding's lookup)."""
        groups = self.packed.index_select(0, ids // native.Q4_GROUP)
        w = native.unpack_q4(groups, self.in_features, groups.shape[0] * native.Q4_GROUP)
        return w.reshape(-1, native.Q4_GROUP, self.in_features)[torch.arange(len(ids)), ids % native.Q4_GROUP]


class Q8(_TwoSteps):
    """int8 weights in blocks of 32 inputs with a float16 scale per 16 (``w = q * scale``) times
    activations quantised to int8 per 16 inputs on every call (llama.cpp's Q8_0 x Q8_0 scheme, in
    half its block size), on the backend's own kernel. Weights dequantised from 6- and 8-bit GGUF
    types (Q6_K, Q8_0) are kept (to float16 rounding of each scale). Every row is computed on its
    own, in the same order whatever the batch: a row's result never depends on the other rows."""

    KIND = "q8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        packed, self.exact = native.pack_q8(weight)
        self._set(packed, int(weight.shape[1]), int(weight.shape[0]), bias)

    @classmethod
    def from_packed(cls, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> "Q8":
        """The layer over ``out_features`` rows packed by this format's packer."""
        layer = cls.__new__(cls)
        layer.exact = float("nan")
        layer._set(packed, cls._in_features(packed.shape[1]), out_features, bias)
        return layer

    @staticmethod
    def _in_features(row_bytes: int) -> int:
        return native.q8_in_features(row_bytes)

    def _set(self, packed: torch.Tensor, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        if -(-out_features // native.Q4_GROUP) != packed.shape[0]:
            raise ValueError(f"{packed.shape[0]} packed {self.KIND} groups cannot hold {out_features} rows")
        self.op = getattr(native.require_q4(), f"{self.KIND}_linear")
        self.packed = packed
        self.in_features = in_features
        self.out_features = out_features
        self.bias = None if bias is None else bias.float()

    def dequantised(self) -> torch.Tensor:
        """The effective float32 ``[out, in]`` weight (for tests)."""
        return self.rows(torch.arange(self.out_features))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 ``[len(ids), in]``: the weight rows ``ids`` (a tied embedding's lookup)."""
        return native.q8_rows(self.packed, self.in_features, ids)


class Q5(Q8):
    """5-bit weights with one float16 scale per 32 inputs (GGUF's Q5_0, kept bit for bit; see
    :mod:`pie_backend_torch.q5`) on the same int8 activations and arithmetic as :class:`Q8`, whose
    results it equals bitwise in 0.61 of the weight bytes."""

    KIND = "q5"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None = None) -> None:
        self.exact = 1.0
        self._set(q5.pack(weight) if packed is None else packed, int(weight.shape[1]), int(weight.shape[0]), bias)

    @staticmethod
    def _in_features(row_bytes: int) -> int:
        return q5.in_features(row_bytes)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 ``[len(ids), in]``: the weight rows ``ids`` (a tied embedding's lookup)."""
        return q5.rows(self.packed, self.in_features, ids)


def refine(layer: Linear) -> Linear:
    """``layer`` with two-step int8 activations where it is a native int8-activation layer
    (:class:`_TwoSteps`), else as it is."""
    if isinstance(layer, _TwoSteps):
        layer.fine = True
    return layer


def fit(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    """The narrowest layer that keeps ``weight``'s values: :class:`Q4` where every block of 32
    inputs lies on 16 evenly spaced levels (4-bit GGUF types), :class:`Q5` where every block of 32
    is a 5-bit symmetric grid (Q5_0), :class:`Q8` where every 16 inputs lie on a symmetric int8 grid
    (6-, 8-bit GGUF types), else float32 (F16, BF16, F32 weights)."""
    if weight.device.type == "cpu" and weight.shape[1] % native.Q4_BLOCK == 0:
        if native.holds_q4(weight):
            return Q4(weight, bias)
        packed = q5.pack_if_held(weight)
        if packed is not None:
            return Q5(weight, bias, packed)
        q8 = Q8(weight, bias)
        if q8.exact == 1.0:
            return q8
    return Dense(weight.float(), None if bias is None else bias.float())


class _KeptColumns:
    """Dequantised float32 weights of the input channels met as outliers, for one layer, so that
    each is dequantised once rather than on every call."""

    def __init__(self, fetch: Callable[[torch.Tensor], torch.Tensor], in_features: int) -> None:
        self.fetch = fetch  # channel ids -> float32 [len(ids), out]
        self.slot = np.full(in_features, -1, dtype=np.int64)  # channel -> row of ``table``
        self.table: torch.Tensor | None = None
        self.used = 0

    def __call__(self, channels: torch.Tensor) -> torch.Tensor:
        """float32 ``[len(channels), out]`` for distinct CPU ``channels``."""
        ids = channels.numpy()
        slots = self.slot[ids]
        if slots.min() < 0:
            slots = self._add(ids, ids[slots < 0])
        assert self.table is not None
        return self.table.index_select(0, torch.from_numpy(slots))

    def _add(self, ids: np.ndarray, missing: np.ndarray) -> np.ndarray:
        if self.used + len(missing) > _KEPT_COLUMNS:
            self.slot[:] = -1
            self.used = 0
            missing = ids
        cols = self.fetch(torch.from_numpy(missing))
        if self.table is None:
            self.table = cols.new_empty(_KEPT_COLUMNS, cols.shape[1])
        self.table[self.used : self.used + len(missing)] = cols
        self.slot[missing] = np.arange(self.used, self.used + len(missing))
        self.used += len(missing)
        return self.slot[ids]


def _has_vnni() -> bool:
    """Whether oneDNN's int8 kernels behind ``torch._int_mm`` have VNNI (AVX512-VNNI, AVX-VNNI or AMX)."""
    return bool(torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported())


def _fbgemm_pack(weight: torch.Tensor, scale: torch.Tensor) -> Any:
    """fbgemm's packed form of symmetric per-output-channel int8 weights (no bias)."""
    with warnings.catch_warnings():  # quantized tensors are deprecated as a user API; fbgemm's packing still takes one
        warnings.simplefilter("ignore", UserWarning)
        q = torch._make_per_channel_quantized_tensor(
            weight, scale.double(), torch.zeros(weight.shape[0], dtype=torch.int64), 0
        )
        engine = torch.backends.quantized.engine
        torch.backends.quantized.engine = "fbgemm"
        try:
            return torch.ops.quantized.linear_prepack(q, None)
        finally:
            torch.backends.quantized.engine = engine


class Int8Dynamic(_Int8Weights):
    """int8 weights (one scale per output channel) times int8 activations quantised per token on
    every call: 5-7x less CPU time than bf16 from 8 rows up on a CPU without AMX, and 2x less than
    int4 weight-only at one row on an AVX2 CPU. Outlier input channels (see
    :data:`_OUTLIER_CHANNELS`) bypass the activation quantisation: their products use the
    dequantised weight columns.

    The integer product is ``torch._int_mm`` (oneDNN) on a CPU with VNNI, and fbgemm's
    ``quantized::linear_dynamic`` elsewhere (oneDNN has no fast int8 path without VNNI; fbgemm's
    AVX2 kernels do). fbgemm quantises the activation per tensor, to 7 bits on such CPUs (so that
    its 16-bit pair sums cannot saturate); rows are scaled to a peak of 1 before the call and back
    after it, which makes that per token, as on the VNNI path."""

    def _set(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super()._set(weight, scale.float(), None if bias is None else bias.float())
        self.packed = None
        self.rows: torch.Tensor | None = None  # [in, out]: outlier channels' weights as contiguous rows
        if not _has_vnni() and weight.device.type == "cpu":
            self.packed = _fbgemm_pack(self.weight, self.scale)
            # fbgemm keeps its own copy, so this one is read only for outlier channels: stored
            # input-major, reading them is a few contiguous rows, not a strided pass over all
            self.rows = self.weight.t().contiguous()
            self.weight = self.rows.t()
        self.kept = _KeptColumns(self._outlier_columns, int(weight.shape[1]))

    def _outlier_columns(self, outliers: torch.Tensor) -> torch.Tensor:
        """float32 ``[len(outliers), out]``: the dequantised weights of those input channels."""
        if self.rows is not None:
            return self.rows.index_select(0, outliers).float().mul_(self.scale)
        return self.weight.index_select(1, outliers).float().mul_(self.scale[:, None]).t()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ops = native.ops() if self.packed is None and x.device.type == "cpu" else None
        if ops is not None:  # the same steps, fused in csrc/q4.cpp
            xq, step, outliers, wide = ops.w8a8_quantise(x, _OUTLIER_CHANNELS)
            acc = torch._int_mm(xq, self.weight.t())
            return ops.w8a8_finish(acc, step, self.scale, wide, self.kept(outliers), self.bias).to(x.dtype)
        xf = x.float()
        rows, width = xf.shape
        peaks = xf.abs() if rows == 1 else xf.abs().amax(dim=0, keepdim=True)
        outliers = peaks.topk(min(_OUTLIER_CHANNELS, width), dim=1, sorted=False).indices[0]
        wide = xf.index_select(1, outliers)
        xf = xf.index_fill(1, outliers, 0.0)
        if self.packed is None:
            step = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127.0)
            xq = xf.div_(step).round_().to(torch.int8)
            y = torch._int_mm(xq, self.weight.t()).mul(step * self.scale)  # int32 * float32 -> float32
        elif rows == 1:  # fbgemm's per-tensor range is the token's own
            y = torch.ops.quantized.linear_dynamic(xf, self.packed, True)
        else:
            peak = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)
            y = torch.ops.quantized.linear_dynamic(xf.div_(peak), self.packed, True).mul_(peak)
        y.addmm_(wide, self.kept(outliers))
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
    """A linear layer of ``kind`` (``"none"``, ``"int8"``, ``"int4"``, ``"w8a8"``, ``"q4"``, ``"q8"``,
    ``"fit"``) over float ``weight``.

    ``max_tokens > 0`` keeps a second layer for batches of more rows: dense weights (``large``
    ``"none"``) or :class:`Int8Dynamic` (``"w8a8"``). int4 needs the input width to be a multiple
    of :data:`INT4_GROUP` and the output one of 16 (:func:`fits_int4`); other layers fall back to
    int8. q4 needs the input width to be a multiple of 32; other layers fall back to w8a8.
    """
    b = None if bias is None else bias.to(dtype)
    if kind == "none":
        return dense(weight, bias, dtype)
    if kind == "fit":  # one layer for every batch size: a row's result never depends on the batch
        return fit(weight, bias)
    if kind == "w8a8":
        small: Linear = Int8Dynamic(weight, bias)
    elif kind == "int4" and fits_int4(weight):
        small = Int4(weight, b)
    elif kind == "q4":
        small = Q4(weight, bias) if weight.shape[1] % native.Q4_BLOCK == 0 else Int8Dynamic(weight, bias)
    elif kind == "q8":
        small = Q8(weight, bias) if weight.shape[1] % native.Q4_BLOCK == 0 else Int8Dynamic(weight, bias)
    else:
        small = Int8(weight, b)
    if max_tokens <= 0 or (kind == "w8a8" and large == "w8a8"):
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
    elif isinstance(layer, Q4):
        out = {"q4": layer.packed, "q4_rows": torch.tensor(layer.out_features)}
    elif isinstance(layer, Q8):  # and Q5
        out = {layer.KIND: layer.packed, f"{layer.KIND}_rows": torch.tensor(layer.out_features)}
    elif isinstance(layer, Dense) and layer.weight.dtype == torch.float32:
        out = {"dense32": layer.weight}
    elif isinstance(layer, Int8Dynamic):
        out = {"w8a8": layer.weight, "scale": layer.scale}
    elif isinstance(layer, Int8):
        out = {"int8": layer.weight, "scale": layer.scale}
    else:
        out = {"dense": weight.to(dtype)}
    if getattr(layer, "fine", False):
        out["fine"] = torch.tensor(1)
    return out if bias is None else out | {"bias": bias.clone()}  # small and large may share one tensor


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
    if "fine" in tensors:
        return refine(rebuild_layer({k: v for k, v in tensors.items() if k != "fine"}, dtype, max_tokens))
    if "int4" in tensors:
        return Int4.from_packed(tensors["int4"], tensors["scales_and_zeros"], bias)
    if "q4" in tensors:
        return Q4.from_packed(tensors["q4"], int(tensors["q4_rows"]), bias)
    if "q8" in tensors:
        return Q8.from_packed(tensors["q8"], int(tensors["q8_rows"]), bias)
    if "q5" in tensors:
        return Q5.from_packed(tensors["q5"], int(tensors["q5_rows"]), bias)
    if "dense32" in tensors:
        return Dense(tensors["dense32"], bias)
    if "w8a8" in tensors:
        return Int8Dynamic.from_quantised(tensors["w8a8"], tensors["scale"], bias)
    if "int8" in tensors:
        return Int8.from_quantised(tensors["int8"], tensors["scale"], bias)
    if "dense" in tensors:
        return dense(tensors["dense"], bias, dtype)
    raise ValueError(f"no linear layer in tensors {sorted(tensors)}")
