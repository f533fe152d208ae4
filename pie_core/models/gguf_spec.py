"""GGUF metadata → :class:`ModelSpec`.

What GGUF does not record is filled in the way llama.cpp runs the model: Gemma 3 has a
sliding-window pattern of 6 (every sixth layer full) and a local RoPE base of 10 000 unless the
file says otherwise; llama 3's RoPE scaling is stored as a ``rope_freqs.weight`` tensor, from
which the scaling parameters are recovered and checked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pie_core.errors import InvalidInput, Unsupported
from pie_core.models.gguf_file import GGUFFile
from pie_core.models.spec import ARCHITECTURES, ModelSpec, RopeConfig

__all__ = ["spec_from_gguf", "llama3_inv_freq_factors"]


def llama3_inv_freq_factors(
    head_dim: int, theta: float, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """Per-frequency divisors llama 3 applies to RoPE inverse frequencies.

    Returns:
        ``[head_dim // 2]`` float32: 1 for high frequencies, ``factor`` for low ones, a smooth
        blend between (the values llama.cpp stores as ``rope_freqs.weight``).
    """
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    smooth = (original / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, blended))
    return out.astype(np.float32)


def _rope(f: GGUFFile, arch: str, head_dim: int, rope_freqs: np.ndarray | None) -> RopeConfig:
    theta = float(f.get(f"{arch}.rope.freq_base", 1_000_000.0 if arch == "gemma3" else 10_000.0))
    local = float(f.get(f"{arch}.rope.freq_base_swa", 10_000.0)) if arch == "gemma3" else None
    kind = str(f.get(f"{arch}.rope.scaling.type", "none"))
    factor = float(f.get(f"{arch}.rope.scaling.factor", 1.0))
    original = int(f.get(f"{arch}.rope.scaling.original_context_length", 8192))
    if rope_freqs is not None:
        # Every llama 3.x release uses low/high frequency factors 1 and 4; check, don't assume.
        found = float(rope_freqs.max())
        expected = llama3_inv_freq_factors(head_dim, theta, found, 1.0, 4.0, original)
        if not np.allclose(expected, rope_freqs, rtol=1e-4, atol=1e-5):
            raise Unsupported("rope_freqs.weight does not match llama 3 RoPE scaling (low 1, high 4); cannot run it")
        return RopeConfig(theta, local, "llama3", found, 1.0, 4.0, original)
    if kind in ("none", "") or factor == 1.0:
        return RopeConfig(theta=theta, local_theta=local)
    if kind == "linear":
        return RopeConfig(theta=theta, local_theta=local, scaling="linear", factor=factor)
    raise Unsupported(f"GGUF rope scaling {kind!r} is not supported; supported: none, linear, llama3")


def _layer_types(f: GGUFFile, arch: str, num_layers: int) -> tuple[str, ...]:
    if arch != "gemma3":
        return ()
    pattern: Any = f.get(f"{arch}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, np.ndarray):  # per-layer flags, true = sliding
        if len(pattern) != num_layers:
            raise InvalidInput(f"sliding_window_pattern has {len(pattern)} entries for {num_layers} layers")
        return tuple("sliding" if p else "full" for p in pattern)
    n = int(pattern)
    return tuple("sliding" if (i + 1) % n else "full" for i in range(num_layers))


def spec_from_gguf(f: GGUFFile, rope_freqs: np.ndarray | None = None) -> ModelSpec:
    """Build the spec of a GGUF checkpoint from its metadata and tensor list.

    Args:
        f: The parsed file.
        rope_freqs: The dequantised ``rope_freqs.weight`` when the file has one (llama 3).

    Returns:
        The spec; ``tie_embeddings`` is true when there is no ``output.weight``.

    Raises:
        Unsupported: Unknown architecture or RoPE scaling.
        InvalidInput: Required metadata is missing.
    """
    arch = f.architecture
    if arch not in ARCHITECTURES:
        raise Unsupported(f"GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")

    def need(key: str) -> Any:
        value = f.get(f"{arch}.{key}")
        if value is None:
            raise InvalidInput(f"{f.path.name}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads_raw = f.get(f"{arch}.attention.head_count_kv", heads)
    kv_heads = int(np.max(kv_heads_raw)) if isinstance(kv_heads_raw, np.ndarray) else int(kv_heads_raw)
    head_dim = int(f.get(f"{arch}.attention.key_length", hidden // heads))
    num_layers = int(need("block_count"))
    vocab = f.tensor("token_embd.weight").shape[0]
    gemma = arch == "gemma3"
    layer_types = _layer_types(f, arch, num_layers)
    window = f.get(f"{arch}.attention.sliding_window")
    if gemma:
        # llama.cpp: 27B scales queries by (hidden/heads)^-0.5, the others by head_dim^-0.5.
        attn_scale: float | None = float(hidden // heads if num_layers == 62 else head_dim) ** -0.5
    else:
        attn_scale = None
    softcap = f.get(f"{arch}.attn_logit_softcapping")
    final_softcap = f.get(f"{arch}.final_logit_softcapping")
    return ModelSpec(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(need("feed_forward_length")),
        rms_norm_eps=float(f.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope=_rope(f, arch, head_dim, rope_freqs),
        max_position=int(f.get(f"{arch}.context_length", 32768)),
        tie_embeddings=not f.has_tensor("output.weight"),
        qkv_bias=f.has_tensor("blk.0.attn_q.bias"),
        qk_norm=f.has_tensor("blk.0.attn_q_norm.weight"),
        hidden_act="gelu_tanh" if gemma else "silu",
        embed_scale=math.sqrt(hidden) if gemma else 1.0,
        sandwich_norm=f.has_tensor("blk.0.post_attention_norm.weight"),
        sliding_window=int(window) if layer_types and window else None,
        layer_types=layer_types if layer_types and window else (),
        attn_scale=attn_scale,
        attn_softcap=None if softcap is None else float(softcap),
        final_softcap=None if final_softcap is None else float(final_softcap),
    )
