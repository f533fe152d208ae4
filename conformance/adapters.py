"""Adapters for the adapter cases: random LoRA weights, and base weights with them merged in.

The merged model is the oracle for adapter numerics: ``W + scaling * B @ A`` loaded into the
float64 oracle as plain weights runs none of the backend's adapter code.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from pie_core.backend_kit.lora import TARGETS, target_shape, tensor_name
from pie_core.models.spec import ModelSpec

__all__ = ["random_adapter", "merged"]


def random_adapter(
    spec: ModelSpec, rank: int, seed: int, targets: tuple[str, ...] = TARGETS, layers: Iterable[int] | None = None
) -> dict[str, np.ndarray]:
    """LoRA tensors of ``rank`` over ``targets`` of ``layers`` (all by default), sized so the
    delta moves the logits clearly but stays well inside the model's range."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for layer in range(spec.num_layers) if layers is None else layers:
        for target in targets:
            rows, cols = target_shape(spec, target)
            out[tensor_name(layer, target, "a")] = (rng.standard_normal((rank, cols)) / np.sqrt(cols)).astype(np.float32)
            out[tensor_name(layer, target, "b")] = (0.3 * rng.standard_normal((rows, rank)) / np.sqrt(rank)).astype(np.float32)
    return out


def merged(
    weights: Iterable[tuple[str, np.ndarray]], tensors: dict[str, np.ndarray], scaling: float
) -> Iterator[tuple[str, np.ndarray]]:
    """``weights`` (canonical names) with ``scaling * B @ A`` added to every adapted projection."""
    for name, w in weights:
        if name.endswith(".weight") and name.startswith("blk."):
            a = tensors.get(name[: -len("weight")] + "lora_a")
            if a is not None:
                b = tensors[name[: -len("weight")] + "lora_b"]
                w = (w.astype(np.float64) + scaling * (b.astype(np.float64) @ a.astype(np.float64))).astype(np.float32)
        yield name, w
