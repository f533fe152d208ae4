"""Rotary position embeddings in the "rotate half" (NeoX / Hugging Face) layout.

Angles are computed in float64 on the host (as the NumPy reference does) and applied on the
device as ``x * C + roll(x, half) * S`` with ``C = [cos, cos]`` and ``S = [-sin, sin]``: one
multiply-add over Q and K heads together. The softmax scale is folded into the Q heads' tables,
so attention needs no separate scaling.
"""

from __future__ import annotations

import numpy as np
import torch

from pie_core.backend_kit import ModelSpec, layer_frequencies

__all__ = ["RopeTables", "Rotation", "apply_rotation", "device_rotation"]


class Rotation:
    """One batch's RoPE for one layer kind: ``[N, heads + kv_heads, head_dim]`` tables.

    ``cos``/``sin`` (``[N, head_dim // 2]`` float32) are kept for the fused Triton kernel, which
    needs nothing else (``c``/``s`` are None in rotations made for it alone).
    """

    __slots__ = ("c", "s", "cos", "sin")

    def __init__(self, c: torch.Tensor | None, s: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.c, self.s, self.cos, self.sin = c, s, cos, sin


class RopeTables:
    """Inverse frequencies for the model's two layer kinds ("full" and "sliding"), from
    :func:`pie_core.backend_kit.layer_frequencies`."""

    def __init__(self, spec: ModelSpec, device: torch.device) -> None:
        self.full, self.sliding = layer_frequencies(spec)
        self.device = device
        head_scale = np.ones(spec.num_heads + spec.num_kv_heads, dtype=np.float64)
        head_scale[: spec.num_heads] = spec.scale
        self.head_scale = head_scale

    def rotation(self, positions: np.ndarray, sliding: bool, heads_tables: bool = True) -> Rotation:
        """Tables for the given positions; Q heads carry the softmax scale.

        ``heads_tables=False`` makes only the ``cos``/``sin`` the Triton kernel reads.
        """
        inv = self.sliding if sliding else self.full
        angles = positions.astype(np.float64)[:, None] * inv[None, :]
        cos = np.cos(angles).astype(np.float32)
        sin = np.sin(angles).astype(np.float32)

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device)

        if not heads_tables:
            return Rotation(None, None, dev(cos), dev(sin))
        c = np.concatenate([cos, cos], axis=1)[:, None, :] * self.head_scale[None, :, None]
        s = np.concatenate([-sin, sin], axis=1)[:, None, :] * self.head_scale[None, :, None]
        return Rotation(dev(c), dev(s), dev(cos), dev(sin))


def device_rotation(inv_freq: torch.Tensor, positions: torch.Tensor) -> Rotation:
    """``cos``/``sin`` tables computed on the device from positions (for captured graphs).

    Args:
        inv_freq: float64 ``[head_dim // 2]`` on the device (``torch.from_numpy(tables.full)``).
        positions: int ``[N]`` on the device.

    Returns:
        A rotation carrying only ``cos``/``sin`` (what the Triton kernel reads).
    """
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    return Rotation(None, None, cos, sin)


def apply_rotation(x: torch.Tensor, rot: Rotation) -> torch.Tensor:
    """Rotate ``x`` ``[N, heads + kv_heads, head_dim]`` (Q heads first) by ``rot``, in float32
    (rounding the angles' sines to 16 bits would cost more accuracy than the rest of a layer);
    the result has ``x``'s dtype."""
    assert rot.c is not None and rot.s is not None, "this rotation only has the Triton kernel's tables"
    half = x.shape[-1] // 2
    x32 = x.float()
    return torch.addcmul(x32 * rot.c, x32.roll(half, dims=-1), rot.s).to(x.dtype)
