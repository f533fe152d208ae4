"""Rotary position embeddings in the "rotate half" (NeoX / Hugging Face) layout."""

from __future__ import annotations

import math

import numpy as np

from pie_core.models.spec import ModelSpec, RopeConfig

__all__ = ["inverse_frequencies", "RopeTables", "apply_rope"]


def inverse_frequencies(head_dim: int, theta: float, rope: RopeConfig | None) -> np.ndarray:
    """Per-pair inverse frequencies ``[head_dim // 2]`` (float64), with scaling applied.

    Args:
        head_dim: Rotated dimensions per head.
        theta: RoPE base.
        rope: Scaling parameters, or None for plain RoPE.

    Raises:
        ValueError: Unknown scaling kind.
    """
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if rope is None or rope.scaling == "none":
        return inv
    if rope.scaling == "linear":
        return inv / rope.factor
    if rope.scaling == "llama3":
        old = float(rope.original_max_position)
        low_wavelen = old / rope.low_freq_factor
        high_wavelen = old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported RoPE scaling {rope.scaling!r}; expected 'none', 'linear' or 'llama3'")


class RopeTables:
    """Inverse frequencies for the model's two layer kinds ("full" and "sliding")."""

    def __init__(self, spec: ModelSpec) -> None:
        rope = spec.rope
        self.full = inverse_frequencies(spec.head_dim, rope.theta, rope)
        if rope.local_theta is not None:
            self.sliding = inverse_frequencies(spec.head_dim, rope.local_theta, None)
        else:
            self.sliding = self.full

    def cos_sin(self, positions: np.ndarray, sliding: bool) -> tuple[np.ndarray, np.ndarray]:
        """``cos`` and ``sin`` tables ``[head_dim // 2, N]`` float32 for the given positions."""
        inv = self.sliding if sliding else self.full
        angles = inv[:, None] * positions.astype(np.float64)[None, :]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate feature-major ``x`` ``[heads, head_dim, N]`` by ``cos``/``sin`` ``[head_dim // 2, N]``."""
    half = x.shape[1] // 2
    x1, x2 = x[:, :half], x[:, half:]
    out = np.empty(x.shape, dtype=np.float32)
    out[:, :half] = x1 * cos - x2 * sin
    out[:, half:] = x2 * cos + x1 * sin
    return out
