"""LoRA adapter tensors as the backend contract names them, and the zo noise every backend draws.

An adapter holds, for some of the :data:`TARGETS` of some layers, a pair of float32 matrices:
``blk.{i}.{target}.lora_a`` ``[rank, in]`` and ``blk.{i}.{target}.lora_b`` ``[out, rank]``. A
projection ``y = W x`` becomes ``y = W x + scaling * B (A x)``; ``scaling`` is PEFT's
``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA). Targets an adapter does not hold add nothing.

Zeroth-order (zo) passes run an adapter's mean weights plus ``sigma * zo_noise(seed, t)`` on
every tensor it holds, ``t`` being the tensor's index in :func:`tensor_names` order. The noise is
defined here once, so every backend draws the same numbers for a seed: tensor ``t`` under seed
``s`` is ``numpy.random.Generator(numpy.random.Philox(key=(s mod 2^64) + t * 2^64))
.standard_normal(size, dtype=float32)`` in C order. NumPy's Philox stream is stable across
versions and its float32 ziggurat normal has not changed since NumPy 1.17; ``tests/adapters``
pins golden values so a change would be caught. A backend on another device draws on the host and
uploads (once per seed; backends cache perturbed weights per ``(adapter, seed)``).
"""

from __future__ import annotations

import math

import numpy as np

from pie_core.models.spec import ModelSpec

__all__ = [
    "TARGETS",
    "tensor_name",
    "tensor_index",
    "tensor_names",
    "target_shape",
    "check_tensors",
    "adapter_bytes",
    "zo_noise",
    "perturbed",
    "moved",
]

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
"""The projections an adapter may adapt, in the order of :func:`tensor_names`."""

def tensor_name(layer: int, target: str, half: str) -> str:
    """``blk.{layer}.{target}.lora_{half}`` (``half`` is ``"a"`` or ``"b"``)."""
    return f"blk.{layer}.{target}.lora_{half}"


def tensor_index(name: str) -> int:
    """Index of tensor ``name`` in :func:`tensor_names` order (the zo noise index).

    Raises:
        ValueError: ``name`` is not ``blk.{i}.{target}.lora_{a|b}``.
    """
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[2] not in TARGETS \
            or parts[3] not in ("lora_a", "lora_b"):
        raise ValueError(f"{name!r} is not an adapter tensor name (blk.<layer>.<target>.lora_a|lora_b)")
    return (int(parts[1]) * len(TARGETS) + TARGETS.index(parts[2])) * 2 + (parts[3] == "lora_b")


def tensor_names(spec: ModelSpec) -> list[str]:
    """Every tensor name an adapter of ``spec`` may hold, in canonical (zo noise index) order:
    layer by layer, target by target, ``lora_a`` before ``lora_b``."""
    return [tensor_name(i, t, h) for i in range(spec.num_layers) for t in TARGETS for h in ("a", "b")]


def target_shape(spec: ModelSpec, target: str) -> tuple[int, int]:
    """``(out, in)`` of the base projection ``target``.

    Raises:
        ValueError: ``target`` is not one of :data:`TARGETS`.
    """
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes = {
        "attn_q": (q, spec.hidden_size),
        "attn_k": (kv, spec.hidden_size),
        "attn_v": (kv, spec.hidden_size),
        "attn_output": (spec.hidden_size, q),
        "ffn_gate": (spec.intermediate_size, spec.hidden_size),
        "ffn_up": (spec.intermediate_size, spec.hidden_size),
        "ffn_down": (spec.hidden_size, spec.intermediate_size),
    }
    if target not in shapes:
        raise ValueError(f"unknown adapter target {target!r}; expected one of {', '.join(TARGETS)}")
    return shapes[target]


def adapter_bytes(spec: ModelSpec, rank: int, targets: tuple[str, ...] = TARGETS) -> int:
    """float32 bytes of a rank-``rank`` adapter over ``targets`` of every layer."""
    per_layer = sum(rank * sum(target_shape(spec, t)) for t in targets)
    return 4 * per_layer * spec.num_layers


def zo_noise(seed: int, index: int, shape: tuple[int, ...]) -> np.ndarray:
    """The standard-normal noise of tensor ``index`` under zo seed ``seed`` (see the module doc).

    Returns:
        float32 array of ``shape``.
    """
    key = (int(seed) % (1 << 64)) | (int(index) << 64)
    generator = np.random.Generator(np.random.Philox(key=key))
    return generator.standard_normal(math.prod(shape), dtype=np.float32).reshape(shape)


def check_tensors(spec: ModelSpec, tensors: dict[str, np.ndarray], max_rank: int) -> int:
    """Check an adapter's tensors against ``spec`` and return its rank.

    Every held target has both halves, float32, of shapes ``[r, in]`` and ``[out, r]`` with one
    ``r`` for the whole adapter, ``1 <= r <= max_rank``, and finite values.

    Raises:
        ValueError: Naming the first tensor that breaks a rule.
    """
    if not tensors:
        raise ValueError("an adapter holds at least one target")
    ranks = set()
    for name, array in tensors.items():
        index = tensor_index(name)
        layer, target = index // (2 * len(TARGETS)), TARGETS[(index // 2) % len(TARGETS)]
        if layer >= spec.num_layers:
            raise ValueError(f"{name}: the model has {spec.num_layers} layers")
        other = name[:-1] + ("b" if name.endswith("a") else "a")
        if other not in tensors:
            raise ValueError(f"{name} comes without {other}")
        if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != 2:
            raise ValueError(f"{name} must be a 2-D float32 array")
        out, inp = target_shape(spec, target)
        rank = array.shape[0] if name.endswith("a") else array.shape[1]
        expected = (rank, inp) if name.endswith("a") else (out, rank)
        if array.shape != expected:
            raise ValueError(f"{name} has shape {array.shape}; expected {expected}")
        if not np.isfinite(array).all():
            raise ValueError(f"{name} holds a non-finite value")
        ranks.add(rank)
    if len(ranks) != 1:
        raise ValueError(f"an adapter has one rank for every target, got {sorted(ranks)}")
    rank = ranks.pop()
    if not 1 <= rank <= max_rank:
        raise ValueError(f"adapter rank {rank} is outside [1, {max_rank}]")
    return rank


def perturbed(tensors: dict[str, np.ndarray], sigma: float, seed: int) -> dict[str, np.ndarray]:
    """``tensors + sigma * zo_noise(seed, ·)``: the weights a pass with zo seed ``seed`` runs."""
    s = np.float32(sigma)
    return {name: a + s * zo_noise(seed, tensor_index(name), a.shape) for name, a in tensors.items()}


def moved(tensors: dict[str, np.ndarray], seeds: np.ndarray, coefficients: np.ndarray) -> dict[str, np.ndarray]:
    """``tensors + sum_i coefficients[i] * zo_noise(seeds[i], ·)``: a zo update of the mean."""
    out = {}
    for name, a in tensors.items():
        index = tensor_index(name)
        step = a.copy()
        for seed, c in zip(seeds.tolist(), coefficients.tolist()):
            step += np.float32(c) * zo_noise(seed, index, a.shape)
        out[name] = step
    return out
