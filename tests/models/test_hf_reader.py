"""Hugging Face folders → ModelSpec + canonical weights, checked against transformers' state dicts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pie_core.errors import InvalidInput, NotFound, Unsupported
from pie_core.models.hf_reader import canonical_name, read_hf_folder, spec_from_hf_config

ARCHS = ["qwen2", "llama", "qwen3", "gemma3"]


def _hf_state(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in folder.glob("*.safetensors"):
        out.update(load_file(f))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_match_the_hf_state_dict_under_canonical_names(tiny_hf: dict[str, Path], arch: str) -> None:
    spec, weights = read_hf_folder(tiny_hf[arch])
    ours = dict(weights)
    hf = _hf_state(tiny_hf[arch])
    expected = {}
    for name, array in hf.items():
        canon = canonical_name(name, arch)
        if canon is None or (canon == "output.weight" and spec.tie_embeddings):
            continue
        if arch == "gemma3" and canon.endswith("norm.weight"):
            array = array + 1.0  # Gemma's (1 + w) folded in
        expected[canon] = array
    assert set(ours) == set(expected)
    for name, array in expected.items():
        assert ours[name].dtype == np.float32 and ours[name].flags.c_contiguous
        np.testing.assert_array_equal(ours[name], array, err_msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_layer_has_the_tensors_the_spec_promises(tiny_hf: dict[str, Path], arch: str) -> None:
    spec, weights = read_hf_folder(tiny_hf[arch])
    names = {n: a.shape for n, a in weights}
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    assert names["token_embd.weight"] == (spec.vocab_size, h)
    assert ("output.weight" in names) != spec.tie_embeddings
    for i in range(spec.num_layers):
        assert names[f"blk.{i}.attn_q.weight"] == (q, h)
        assert names[f"blk.{i}.attn_k.weight"] == (kv, h)
        assert names[f"blk.{i}.attn_output.weight"] == (h, q)
        assert names[f"blk.{i}.ffn_down.weight"] == (h, spec.intermediate_size)
        assert (f"blk.{i}.attn_q.bias" in names) == spec.qkv_bias
        assert (f"blk.{i}.attn_q_norm.weight" in names) == spec.qk_norm
        assert (f"blk.{i}.post_ffw_norm.weight" in names) == spec.sandwich_norm


def test_specs_of_the_four_architectures(tiny_hf: dict[str, Path]) -> None:
    qwen2, _ = read_hf_folder(tiny_hf["qwen2"])
    assert (qwen2.qkv_bias, qwen2.tie_embeddings, qwen2.rope.theta, qwen2.layer_types) == (True, True, 1e6, ())
    llama, _ = read_hf_folder(tiny_hf["llama"])
    assert llama.rope.scaling == "llama3" and llama.rope.factor == 8.0 and llama.rope.original_max_position == 8192
    assert not llama.qkv_bias and not llama.tie_embeddings
    qwen3, _ = read_hf_folder(tiny_hf["qwen3"])
    assert qwen3.qk_norm and qwen3.head_dim == 32 and qwen3.num_heads * qwen3.head_dim != qwen3.hidden_size
    gemma, _ = read_hf_folder(tiny_hf["gemma3"])
    assert gemma.hidden_act == "gelu_tanh" and gemma.sandwich_norm and gemma.qk_norm and gemma.tie_embeddings
    assert gemma.embed_scale == pytest.approx(math.sqrt(64))
    assert gemma.attn_scale == pytest.approx(24**-0.5)
    assert gemma.sliding_window == 8 and gemma.layer_types == ("sliding", "full", "sliding")
    assert gemma.rope.theta == 1e6 and gemma.rope.local_theta == 10000.0


def test_v4_style_gemma_config_is_understood() -> None:
    config = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
        "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512,
        "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": None, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
    }
    spec = spec_from_hf_config(config)
    assert spec.layer_types.count("full") == 3 and spec.layer_types[5] == "full" and spec.is_sliding(0)
    assert spec.rope.local_theta == 10000.0 and spec.attn_scale == pytest.approx(1 / 16)
    assert spec.tie_embeddings


def test_multimodal_gemma_config_reads_its_text_config() -> None:
    text = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    spec = spec_from_hf_config({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text})
    assert spec.arch == "gemma3" and spec.rope.scaling == "linear" and spec.rope.factor == 8.0
    assert canonical_name("model.language_model.layers.1.mlp.up_proj.weight", "gemma3") == "blk.1.ffn_up.weight"
    assert canonical_name("model.vision_tower.encoder.x.weight", "gemma3") is None


def test_unsupported_architecture_and_rope_type_are_refused() -> None:
    with pytest.raises(Unsupported, match="supported architectures"):
        spec_from_hf_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    base = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
            "num_attention_heads": 4, "vocab_size": 10}
    with pytest.raises(Unsupported, match="yarn"):
        spec_from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(InvalidInput, match="vocab_size"):
        spec_from_hf_config({k: v for k, v in base.items() if k != "vocab_size"})


def test_bf16_and_sharded_checkpoints_read_as_float32(tmp_path: Path) -> None:
    import torch
    import transformers as T

    torch.manual_seed(1)
    config = T.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2)
    model = T.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    spec, weights = read_hf_folder(tmp_path)
    ours = dict(weights)
    state = model.state_dict()
    assert not spec.tie_embeddings and "output.weight" in ours
    np.testing.assert_array_equal(ours["output.weight"], state["lm_head.weight"].float().numpy())
    np.testing.assert_array_equal(ours["blk.1.attn_v.bias"], state["model.layers.1.self_attn.v_proj.bias"].float().numpy())


def test_missing_config_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="config.json"):
        read_hf_folder(tmp_path)


def test_checkpoint_without_lm_head_is_treated_as_tied(tiny_hf: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "untied"
    folder.mkdir()
    config = json.loads((tiny_hf["qwen2"] / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").symlink_to(tiny_hf["qwen2"] / "model.safetensors")
    spec, weights = read_hf_folder(folder)
    assert spec.tie_embeddings and "output.weight" not in dict(weights)
