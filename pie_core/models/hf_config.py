"""Hugging Face ``config.json`` → :class:`ModelSpec`.

Accepts both the transformers v4 layout (``rope_theta`` + ``rope_scaling``, Gemma's
``rope_local_base_freq`` and ``sliding_window_pattern``) and the v5 layout (``rope_parameters``,
per layer type for Gemma 3, and explicit ``layer_types``). Multimodal wrappers that nest the
language model under ``text_config`` are unwrapped.
"""

from __future__ import annotations

import math
from typing import Any

from pie_core.errors import InvalidInput, Unsupported
from pie_core.models.spec import ARCHITECTURES, ModelSpec, RopeConfig

__all__ = ["spec_from_hf_config", "hf_arch"]

# config.json "model_type" / "architectures" entry → our architecture name.
_MODEL_TYPES = {
    "qwen2": "qwen2",
    "llama": "llama",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
}
_ARCH_CLASSES = {
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
}
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "full": "full", "sliding": "sliding"}


def hf_arch(config: dict[str, Any]) -> str:
    """Name the architecture of a Hugging Face config.

    Args:
        config: The parsed ``config.json``.

    Returns:
        One of :data:`ARCHITECTURES`.

    Raises:
        Unsupported: The config describes an architecture this engine does not run.
    """
    model_type = str(config.get("model_type", ""))
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    for cls in config.get("architectures") or ():
        if cls in _ARCH_CLASSES:
            return _ARCH_CLASSES[cls]
    raise Unsupported(
        f"model_type {model_type!r} (architectures {config.get('architectures')}) is not supported; "
        f"supported architectures: {', '.join(ARCHITECTURES)}"
    )


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = dict(text)
        merged.setdefault("model_type", config.get("model_type"))
        merged.setdefault("architectures", config.get("architectures"))
        if "tie_word_embeddings" in config:
            merged.setdefault("tie_word_embeddings", config["tie_word_embeddings"])
        return merged
    return config


def _rope(params: dict[str, Any] | None, theta: float) -> RopeConfig:
    """Build a RopeConfig from one rope parameter dict (v4 ``rope_scaling`` or v5 ``rope_parameters``)."""
    params = dict(params or {})
    theta = float(params.get("rope_theta", theta))
    kind = str(params.get("rope_type", params.get("type", "default")))
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, scaling="linear", factor=float(params["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            scaling="llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position=int(params.get("original_max_position_embeddings", 8192)),
        )
    raise Unsupported(f"rope type {kind!r} is not supported; supported: default, linear, llama3")


def _rope_config(cfg: dict[str, Any], arch: str) -> RopeConfig:
    default_theta = 1_000_000.0 if arch == "gemma3" else 10_000.0
    params = cfg.get("rope_parameters")
    if arch == "gemma3":
        if isinstance(params, dict) and "full_attention" in params:
            full = _rope(params["full_attention"], default_theta)
            local = params.get("sliding_attention") or {}
            local_theta = float(local.get("rope_theta", 10_000.0))
        else:
            full = _rope(cfg.get("rope_scaling"), float(cfg.get("rope_theta", default_theta)))
            local_theta = float(cfg.get("rope_local_base_freq", 10_000.0))
        return RopeConfig(
            theta=full.theta,
            local_theta=local_theta,
            scaling=full.scaling,
            factor=full.factor,
            low_freq_factor=full.low_freq_factor,
            high_freq_factor=full.high_freq_factor,
            original_max_position=full.original_max_position,
        )
    if isinstance(params, dict):
        return _rope(params, float(cfg.get("rope_theta", default_theta)))
    return _rope(cfg.get("rope_scaling"), float(cfg.get("rope_theta", default_theta)))


def _layer_types(cfg: dict[str, Any], arch: str, num_layers: int) -> tuple[str, ...]:
    if arch == "gemma3":
        types = cfg.get("layer_types")
        if types is None:
            pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
            return tuple("sliding" if (i + 1) % pattern else "full" for i in range(num_layers))
    elif arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        types = cfg.get("layer_types")
        if types is None:
            first_full = int(cfg.get("max_window_layers", num_layers))
            return tuple("sliding" if i >= first_full else "full" for i in range(num_layers))
    else:
        return ()
    try:
        mapped = tuple(_LAYER_TYPES[t] for t in types)
    except KeyError as e:
        raise Unsupported(f"layer type {e.args[0]!r} is not supported; supported: full_attention, sliding_attention") from None
    return () if all(t == "full" for t in mapped) else mapped


def spec_from_hf_config(config: dict[str, Any]) -> ModelSpec:
    """Translate a Hugging Face ``config.json`` into a :class:`ModelSpec`.

    Args:
        config: The parsed ``config.json`` (a ``text_config`` inside it is used when present).

    Returns:
        The model's spec. Gemma 3 gets ``embed_scale = sqrt(hidden)``, ``attn_scale =
        query_pre_attn_scalar ** -0.5``, sandwich norms, QK norm, ``gelu_tanh`` and its
        per-layer sliding/full pattern with the local RoPE base in ``rope.local_theta``.

    Raises:
        Unsupported: Unknown architecture, RoPE type, layer type or MLP bias.
        InvalidInput: A required field is missing.
    """
    arch = hf_arch(config)
    cfg = _text_config(config)
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        num_layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
        intermediate = int(cfg["intermediate_size"])
    except KeyError as e:
        raise InvalidInput(f"config.json lacks required field {e.args[0]!r}") from None
    if cfg.get("use_bidirectional_attention"):
        raise Unsupported("use_bidirectional_attention=true (an encoder-style Gemma) is not supported")
    if cfg.get("mlp_bias"):
        raise Unsupported("mlp_bias=true is not supported (no ModelSpec field for MLP biases)")
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    gemma = arch == "gemma3"
    layer_types = _layer_types(cfg, arch, num_layers)
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu"))
    if act in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new"):
        act = "gelu_tanh"
    if act != ("gelu_tanh" if gemma else "silu"):
        raise Unsupported(f"hidden activation {act!r} is not supported for {arch}")
    return ModelSpec(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=_rope_config(cfg, arch),
        max_position=int(cfg.get("max_position_embeddings", 32768)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch in ("qwen3", "gemma3"),
        hidden_act=act,
        embed_scale=math.sqrt(hidden) if gemma else 1.0,
        sandwich_norm=gemma,
        sliding_window=int(cfg["sliding_window"]) if layer_types and cfg.get("sliding_window") else None,
        layer_types=layer_types,
        attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5 if gemma else None,
        attn_softcap=_opt_float(cfg.get("attn_logit_softcapping")),
        final_softcap=_opt_float(cfg.get("final_logit_softcapping")),
    )


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
