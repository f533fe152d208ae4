"""Rotary position embeddings in the "rotate half" (NeoX / Hugging Face) layout."""

from __future__ import annotations

import numpy as np

from pie_core.backend_kit import ModelSpec, layer_frequencies

__all__ = ["RopeTables", "apply_rope"]


class RopeTables:
    """Inverse frequencies for the model's two layer kinds ("full" and "sliding"), from
    :func:`pie_core.backend_kit.layer_frequencies`."""

    def __init__(self, spec: ModelSpec) -> None:
        self.full, self.sliding = layer_frequencies(spec)

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
