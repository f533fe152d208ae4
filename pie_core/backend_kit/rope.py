"""Rotary position embedding frequencies, the same float64 numbers for every backend.

A backend turns these into angles (``position * inverse_frequency``) and applies them in its own
layout and dtype; computing the frequencies once here keeps RoPE scaling (linear, llama3) and
Gemma's local base for sliding layers identical across backends.
"""

from __future__ import annotations

import math

import numpy as np

from pie_core.models.spec import ModelSpec, RopeConfig

__all__ = ["inverse_frequencies", "layer_frequencies"]


def inverse_frequencies(head_dim: int, theta: float, rope: RopeConfig | None) -> np.ndarray:
    """Per-pair inverse frequencies ``[head_dim // 2]`` (float64), with scaling applied.

    Args:
        head_dim: Rotated dimensions per head.
        theta: RoPE base.
        rope: Scaling parameters, or None for plain RoPE.

    Returns:
        ``1 / theta ** (2i / head_dim)`` for ``i < head_dim // 2``, scaled as ``rope`` says.

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


def layer_frequencies(spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """Inverse frequencies of the model's two layer kinds.

    Args:
        spec: The model; ``spec.rope`` gives the base, the scaling and the local base.

    Returns:
        ``(full, sliding)``, float64 ``[head_dim // 2]`` each. Full-attention layers use
        ``rope.theta`` with ``rope``'s scaling; sliding-window layers use plain RoPE at
        ``rope.local_theta`` when the model sets one (Gemma 3), else the same table as full
        layers (the same array object).

    Raises:
        ValueError: Unknown scaling kind.
    """
    rope = spec.rope
    full = inverse_frequencies(spec.head_dim, rope.theta, rope)
    if rope.local_theta is None:
        return full, full
    return full, inverse_frequencies(spec.head_dim, rope.local_theta, None)
