"""Tiny random models of every architecture the core supports.

Each spec is a few kilobytes of weights but keeps what makes its architecture distinct, so a
backend that runs them right runs the real checkpoints right: ``qwen2`` (GQA, QKV bias, tied
embeddings), ``llama`` (untied head, llama3 RoPE scaling that bites within a few dozen
positions), ``qwen3`` (QK norm, head_dim not hidden/heads), ``gemma3`` (sandwich norms, QK norm,
gelu, embedding scale, sliding window of 5 on two of three layers with a local RoPE base, final
logit softcap). Vocabulary sizes are not multiples of 8, so packed logit masks end mid-byte.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from pie_core.models.spec import ARCHITECTURES, ModelSpec, RopeConfig

__all__ = ["ARCHITECTURES", "tiny_spec", "random_weights", "with_twin"]


def tiny_spec(arch: str = "qwen2") -> ModelSpec:
    """A small :class:`ModelSpec` of ``arch``.

    Args:
        arch: One of :data:`pie_core.models.spec.ARCHITECTURES`.

    Raises:
        ValueError: ``arch`` is not a supported architecture.
    """
    if arch == "qwen2":
        return ModelSpec(
            arch="qwen2",
            vocab_size=101,
            hidden_size=48,
            num_layers=2,
            num_heads=6,
            num_kv_heads=2,
            head_dim=8,
            intermediate_size=80,
            qkv_bias=True,
            tie_embeddings=True,
            rope=RopeConfig(theta=10000.0),
        )
    if arch == "llama":
        return ModelSpec(
            arch="llama",
            vocab_size=89,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=8,
            intermediate_size=64,
            rms_norm_eps=1e-5,
            tie_embeddings=False,
            rope=RopeConfig(
                theta=500000.0,
                scaling="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position=64,
            ),
        )
    if arch == "qwen3":
        return ModelSpec(
            arch="qwen3",
            vocab_size=103,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=48,
            qk_norm=True,
            tie_embeddings=True,
            rope=RopeConfig(theta=1000000.0),
        )
    if arch == "gemma3":
        return ModelSpec(
            arch="gemma3",
            vocab_size=97,
            hidden_size=32,
            num_layers=3,
            num_heads=4,
            num_kv_heads=1,
            head_dim=16,
            intermediate_size=64,
            qk_norm=True,
            hidden_act="gelu_tanh",
            embed_scale=32**0.5,
            sandwich_norm=True,
            sliding_window=5,
            layer_types=("sliding", "sliding", "full"),
            attn_scale=0.2,
            final_softcap=8.0,
            rope=RopeConfig(theta=1e6, local_theta=1e4, scaling="linear", factor=4.0),
            tie_embeddings=True,
        )
    raise ValueError(f"unknown architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")


def random_weights(spec: ModelSpec, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """Canonical-name float32 random weights for ``spec`` (norm weights around 1).

    The same ``(spec, seed)`` always yields the same arrays, so the backend under test and the
    reference load identical models.
    """
    rng = np.random.default_rng(seed)
    h, hd = spec.hidden_size, spec.head_dim
    q_out, kv_out = spec.num_heads * hd, spec.num_kv_heads * hd

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    yield "token_embd.weight", (rng.standard_normal((spec.vocab_size, h))).astype(np.float32)
    if not spec.tie_embeddings:
        yield "output.weight", mat(spec.vocab_size, h)
    yield "output_norm.weight", norm(h)
    for i in range(spec.num_layers):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", norm(h)
        yield p + "attn_q.weight", mat(q_out, h)
        yield p + "attn_k.weight", mat(kv_out, h)
        yield p + "attn_v.weight", mat(kv_out, h)
        if spec.qkv_bias:
            yield p + "attn_q.bias", 0.1 * mat(q_out, 1)[:, 0]
            yield p + "attn_k.bias", 0.1 * mat(kv_out, 1)[:, 0]
            yield p + "attn_v.bias", 0.1 * mat(kv_out, 1)[:, 0]
        if spec.qk_norm:
            yield p + "attn_q_norm.weight", norm(hd)
            yield p + "attn_k_norm.weight", norm(hd)
        yield p + "attn_output.weight", mat(h, q_out)
        if spec.sandwich_norm:
            yield p + "post_attention_norm.weight", norm(h)
            yield p + "post_ffw_norm.weight", norm(h)
        yield p + "ffn_norm.weight", norm(h)
        yield p + "ffn_gate.weight", mat(spec.intermediate_size, h)
        yield p + "ffn_up.weight", mat(spec.intermediate_size, h)
        yield p + "ffn_down.weight", mat(h, spec.intermediate_size)


def with_twin(
    spec: ModelSpec, weights: Iterator[tuple[str, np.ndarray]], token: int, twin: int
) -> Iterator[tuple[str, np.ndarray]]:
    """``weights`` with ``twin``'s row of the output projection set to ``token``'s, so the two
    tokens get exactly equal logits on every row: the cases' source of tied logits.

    With tied embeddings the row is ``token_embd``'s, so the twins are also the same input
    embedding (a prompt without either token runs exactly as on the plain weights).
    """
    head = "token_embd.weight" if spec.tie_embeddings else "output.weight"
    for name, w in weights:
        if name == head:
            w = w.copy()
            w[twin] = w[token]
        yield name, w
