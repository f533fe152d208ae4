"""Helpers of the torch backend tests: more tiny specs, and a loader like ``load_cpu``."""

from __future__ import annotations

from dataclasses import replace

from backend_testkit import random_weights, tiny_spec
from pie_backend_torch import TorchBackend
from pie_core.hookspec import BackendOptions
from pie_core.models.spec import ModelSpec, RopeConfig

__all__ = ["spec_of", "load_torch", "ARCHS"]

ARCHS = ("qwen2", "gemma3", "llama", "qwen3", "softcap")


def spec_of(kind: str) -> ModelSpec:
    """``qwen2``/``gemma3`` from the shared testkit, plus ``llama`` (llama3 RoPE scaling, untied
    head, no bias), ``qwen3`` (QK norm, GQA 4:1) and ``softcap`` (attention soft-capping)."""
    if kind in ("qwen2", "gemma3"):
        return tiny_spec(kind)
    if kind == "llama":
        return ModelSpec(
            arch="llama", vocab_size=89, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=96,
            rope=RopeConfig(theta=10000.0, scaling="llama3", factor=8.0, original_max_position=32),
        )
    if kind == "qwen3":
        return ModelSpec(
            arch="qwen3", vocab_size=97, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=16,
            intermediate_size=64, qk_norm=True, rope=RopeConfig(theta=1e6),
        )
    if kind == "softcap":
        return replace(tiny_spec("gemma3"), attn_softcap=3.0)
    raise ValueError(kind)


def load_torch(
    spec: ModelSpec,
    weights=None,
    page_size: int = 4,
    kv_pages: int = 256,
    host_pages: int = 16,
    dtype: str = "float32",
    **extra,
) -> TorchBackend:
    """A TorchBackend with ``spec`` loaded (random weights, seed 0, unless given)."""
    backend = TorchBackend()
    backend.pie_backend_load_model(
        spec,
        random_weights(spec) if weights is None else weights,
        BackendOptions(page_size=page_size, kv_pages=kv_pages, host_pages=host_pages, dtype=dtype, extra=extra),
    )
    return backend
