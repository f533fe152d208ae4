"""Shared fixtures: tiny random Hugging Face checkpoints and the real embedded GGUFs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pie_core.models.default_model import DEFAULT_MODEL, GEMMA3_270M, ensure_gguf, is_installed

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2)


def _tiny_configs():
    import transformers as T

    return {
        "qwen2": T.Qwen2Config(**TINY, tie_word_embeddings=True, rope_theta=1e6),
        "llama": T.LlamaConfig(
            **TINY,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        ),
        "qwen3": T.Qwen3Config(**TINY, head_dim=32),
        "gemma3": T.Gemma3TextConfig(**TINY, head_dim=32, sliding_window=8, query_pre_attn_scalar=24,
                                     sliding_window_pattern=2, rope_local_base_freq=10000.0),
    }


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random tiny models of every architecture saved with ``save_pretrained`` (safetensors)."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny_hf")
    out = {}
    for arch, config in _tiny_configs().items():
        model = T.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # norms start at 0 (Gemma) or 1: randomise so the +1 fold shows
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.5)
        model.save_pretrained(root / arch)
        out[arch] = root / arch
    return out


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    """The assembled default model (cached under $PIE_CACHE_DIR or ~/.cache/pie)."""
    return ensure_gguf(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Gemma 3 270M, when its package is installed."""
    if not is_installed(GEMMA3_270M):
        pytest.skip(f"gemma3-270m not installed ({GEMMA3_270M.pip})")
    return ensure_gguf(GEMMA3_270M)


@pytest.fixture(scope="session", params=["qwen2", "gemma3"])
def real_gguf(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """``(arch, path)`` of each real GGUF available (Gemma skipped when not installed)."""
    name = "qwen_gguf" if request.param == "qwen2" else "gemma_gguf"
    return request.param, request.getfixturevalue(name)
