"""GGUF container parsing, spec from metadata, and dequantised weights."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from models_reference import hf_gguf_state_dict
from pie_core.errors import InvalidInput, Unsupported
from pie_core.models.gguf_file import GGUFFile
from pie_core.models.gguf_reader import GGUFCheckpoint, read_gguf, unpermute_llama_rows
from pie_core.models.gguf_spec import llama3_inv_freq_factors

H, HEADS, KV, FF, V = 64, 4, 2, 96, 32
D = H // HEADS


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows (rotate-half → interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add(writer: gguf.GGUFWriter, name: str, array: np.ndarray, qtype: Q) -> None:
    if qtype in (Q.F32, Q.F16):
        writer.add_tensor(name, array.astype(np.float32 if qtype == Q.F32 else np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def write_llama_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, Q]], **extra: object) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(H)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_feed_forward_length(FF)
    w.add_context_length(4096)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_array("test.strings", ["a", "ß", "日本", ""])
    w.add_array("test.floats", [1.5, 2.5])
    w.add_bool("test.flag", True)
    w.add_uint64("test.big", 2**40)
    for key, value in extra.items():
        w.add_float32(key, float(value))  # type: ignore[arg-type]
    for name, (array, qtype) in tensors.items():
        _add(w, name, array, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    hf = {
        "token_embd.weight": rng.standard_normal((V, H)).astype(np.float32),
        "output_norm.weight": rng.standard_normal(H).astype(np.float32),
        "blk.0.attn_norm.weight": rng.standard_normal(H).astype(np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((HEADS * D, H)).astype(np.float32),
        "blk.0.attn_k.weight": rng.standard_normal((KV * D, H)).astype(np.float32),
        "blk.0.attn_v.weight": rng.standard_normal((KV * D, H)).astype(np.float32),
        "blk.0.attn_output.weight": rng.standard_normal((H, HEADS * D)).astype(np.float32),
        "blk.0.ffn_norm.weight": rng.standard_normal(H).astype(np.float32),
        "blk.0.ffn_gate.weight": rng.standard_normal((FF, H * 4)).astype(np.float32)[:, :H],
        "blk.0.ffn_up.weight": rng.standard_normal((FF, H)).astype(np.float32),
        "blk.0.ffn_down.weight": rng.standard_normal((H, FF)).astype(np.float32),
    }
    hf["blk.0.ffn_gate.weight"] = np.ascontiguousarray(hf["blk.0.ffn_gate.weight"])
    types = {"blk.0.attn_q.weight": Q.F32, "blk.0.attn_k.weight": Q.F16, "blk.0.attn_v.weight": Q.Q8_0}
    stored = {}
    for name, array in hf.items():
        if name == "blk.0.attn_q.weight":
            array = llama_cpp_permute(array, HEADS)
        elif name == "blk.0.attn_k.weight":
            array = llama_cpp_permute(array, KV)
        stored[name] = (array, types.get(name, Q.F32))
    stored["rope_freqs.weight"] = (llama3_inv_freq_factors(D, 500000.0, 8.0, 1.0, 4.0, 8192), Q.F32)
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_llama_gguf(path, stored)
    return path, hf


def test_parser_agrees_with_gguf_reader(llama_file: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = llama_file
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        value = ours.metadata[key]
        expected = field.contents()
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, expected, err_msg=key)
        else:
            assert value == expected, key
    assert [(t.name, t.qtype, t.offset, t.nbytes) for t in ours.tensors] == [
        (t.name, t.tensor_type, int(t.data_offset), int(t.n_bytes)) for t in ref.tensors
    ]
    assert [t.shape for t in ours.tensors] == [tuple(int(d) for d in reversed(t.shape)) for t in ref.tensors]


def test_llama_spec_recovers_llama3_rope_scaling_from_rope_freqs(llama_file: tuple[Path, dict[str, np.ndarray]]) -> None:
    spec, _ = read_gguf(llama_file[0])
    assert (spec.arch, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == ("llama", H, HEADS, KV, D)
    assert spec.rope.scaling == "llama3" and spec.rope.factor == 8.0 and spec.rope.theta == 500000.0
    assert spec.tie_embeddings and not spec.qkv_bias and spec.rms_norm_eps == pytest.approx(1e-5)


def test_llama_q_and_k_rows_are_unpermuted_to_rotate_half(llama_file: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, hf = llama_file
    _, weights = read_gguf(path)
    ours = dict(weights(workers=2))
    assert "rope_freqs.weight" not in ours and set(ours) == set(hf)
    np.testing.assert_array_equal(ours["blk.0.attn_q.weight"], hf["blk.0.attn_q.weight"])
    np.testing.assert_allclose(ours["blk.0.attn_k.weight"], hf["blk.0.attn_k.weight"], atol=2e-3)
    np.testing.assert_allclose(ours["blk.0.attn_v.weight"], hf["blk.0.attn_v.weight"], atol=0.05)
    for name in ("token_embd.weight", "blk.0.ffn_down.weight"):
        np.testing.assert_array_equal(ours[name], hf[name])


def test_unpermute_inverts_the_llama_cpp_permutation() -> None:
    w = np.arange(8 * 6 * 3, dtype=np.float32).reshape(8 * 6, 3)
    np.testing.assert_array_equal(unpermute_llama_rows(llama_cpp_permute(w, 8), 8), w)


def test_progress_reports_every_stored_byte(llama_file: tuple[Path, dict[str, np.ndarray]]) -> None:
    checkpoint = GGUFCheckpoint(llama_file[0])
    calls: list[tuple[int, int]] = []
    names = [n for n, _ in checkpoint.weights(progress=lambda d, t: calls.append((d, t)))]
    assert len(calls) == len(names) and calls[-1][0] == calls[-1][1] == sum(t.nbytes for t in checkpoint.weight_infos)
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))


def test_not_a_gguf_and_truncated_files_are_refused(tmp_path: Path, llama_file: tuple[Path, dict[str, np.ndarray]]) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(InvalidInput, match="GGUF"):
        GGUFFile(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(llama_file[0].read_bytes()[:-100])
    with pytest.raises(InvalidInput, match="truncated"):
        GGUFFile(cut)


def test_unknown_architecture_is_unsupported(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(Unsupported, match="gpt2"):
        read_gguf(tmp_path / "x.gguf")


# -- the real checkpoints ---------------------------------------------------------------------


@pytest.mark.model
def test_default_model_spec(qwen_gguf: Path) -> None:
    spec, _ = read_gguf(qwen_gguf)
    assert (spec.arch, spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads) == ("qwen2", 24, 896, 14, 2)
    assert (spec.head_dim, spec.intermediate_size, spec.vocab_size) == (64, 4864, 151936)
    assert spec.qkv_bias and not spec.qk_norm and spec.rope.theta == 1e6 and spec.max_position == 32768
    assert not spec.tie_embeddings  # this GGUF ships its own Q8_0 output.weight


@pytest.mark.model
def test_gemma_spec(gemma_gguf: Path) -> None:
    spec, _ = read_gguf(gemma_gguf)
    assert (spec.arch, spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (
        "gemma3", 18, 640, 4, 1, 256)
    assert spec.sandwich_norm and spec.qk_norm and spec.tie_embeddings and spec.hidden_act == "gelu_tanh"
    assert spec.sliding_window == 512 and spec.rope.local_theta == 10000.0 and spec.rope.theta == 1e6
    assert [i for i, t in enumerate(spec.layer_types) if t == "full"] == [5, 11, 17]
    assert spec.embed_scale == pytest.approx(math.sqrt(640)) and spec.attn_scale == pytest.approx(256**-0.5)


HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
    "blk.0.attn_q.bias": "model.layers.0.self_attn.q_proj.bias",
    "blk.3.attn_k.weight": "model.layers.3.self_attn.k_proj.weight",
    "blk.3.ffn_down.weight": "model.layers.3.mlp.down_proj.weight",
    "blk.5.attn_output.weight": "model.layers.5.self_attn.o_proj.weight",
    "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
    "blk.0.attn_q_norm.weight": "model.layers.0.self_attn.q_norm.weight",
    "blk.2.post_ffw_norm.weight": "model.layers.2.post_feedforward_layernorm.weight",
    "blk.2.ffn_norm.weight": "model.layers.2.pre_feedforward_layernorm.weight",
    "blk.2.post_attention_norm.weight": "model.layers.2.post_attention_layernorm.weight",
}


@pytest.mark.model
def test_dequantised_tensors_equal_transformers_gguf_loading(real_gguf: tuple[str, Path]) -> None:
    arch, path = real_gguf
    checkpoint = GGUFCheckpoint(path)
    hf = hf_gguf_state_dict(path)
    quants = {t.name: t.qtype.name for t in checkpoint.file.tensors}
    checked = set()
    for name, array in checkpoint.weights():
        ref_name = HF_NAMES.get(name)
        if arch == "qwen2" and name == "blk.2.ffn_norm.weight":
            ref_name = "model.layers.2.post_attention_layernorm.weight"
        if ref_name is None or ref_name not in hf:
            continue
        expected = hf[ref_name]
        if arch == "gemma3" and name.endswith("norm.weight"):
            expected = expected + 1.0  # transformers subtracts the +1 llama.cpp stored; we keep it
        np.testing.assert_allclose(array, expected, rtol=0, atol=1e-6, err_msg=f"{name} ({quants[name]})")
        checked.add(quants[name])
    assert {"Q5_0", "Q8_0", "F32"} <= checked
