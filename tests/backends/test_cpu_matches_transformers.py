"""The NumPy backend's logits equal Hugging Face transformers' (fp32) on the same weights.

Tiny randomly initialised models of every supported architecture are saved with
``save_pretrained``, read back through ``pie_core.models.hf_reader`` and run through the backend
with pages scattered over the pool, several requests per batch, and prefill followed by
decode steps.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from backend_testkit import kv_request, load_cpu, probe_logits, run  # noqa: E402
from pie_core.models.hf_reader import read_hf_folder  # noqa: E402

PAGE = 4


def _config(arch: str):
    common = dict(
        vocab_size=113,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    if arch == "qwen2":
        return transformers.Qwen2Config(num_hidden_layers=2, tie_word_embeddings=True, **common)
    if arch == "llama":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        return transformers.LlamaConfig(
            num_hidden_layers=2, tie_word_embeddings=False, rope_parameters=rope, **common
        )
    if arch == "qwen3":
        return transformers.Qwen3Config(num_hidden_layers=2, head_dim=32, tie_word_embeddings=False, **common)
    if arch == "gemma3":
        rope = {
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        }
        return transformers.Gemma3TextConfig(
            num_hidden_layers=4,
            head_dim=16,
            sliding_window=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=24,
            rope_parameters=rope,
            final_logit_softcapping=15.0,
            **common,
        )
    raise ValueError(arch)


_MODEL_CLASSES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
# Attention-logit soft-capping is not covered here: transformers' Gemma 3 ignores
# ``attn_logit_softcapping`` (it never passes it to the attention function); the backend's
# soft-capping is checked against a direct implementation in test_cpu_attention.py.


@pytest.fixture(scope="module", params=list(_MODEL_CLASSES))
def hf_pair(request, tmp_path_factory):
    """(torch model, loaded CpuBackend, spec) for one architecture."""
    arch = request.param
    torch.manual_seed(1234)
    config = _config(arch)
    config._attn_implementation = "eager"
    model = getattr(transformers, _MODEL_CLASSES[arch])(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:  # Gemma stores norms as w - 1
                p.copy_(0.2 * torch.randn_like(p) + (0.0 if arch == "gemma3" else 1.0))
            else:
                p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if p.ndim > 1 else 4.0))
    folder = tmp_path_factory.mktemp(arch)
    model.save_pretrained(folder, safe_serialization=True)
    spec, weights = read_hf_folder(folder)
    backend = load_cpu(spec, weights, page_size=PAGE, kv_pages=128)
    return arch, model, backend, spec


def _hf_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        return model(input_ids=ids).logits[0].float().numpy()


def _assert_close(ours: np.ndarray, ref: np.ndarray) -> None:
    scale = float(np.abs(ref).max())
    err = float(np.abs(ours - ref).max())
    assert err <= 1e-5 * scale, f"max |delta| {err:.3g} exceeds 1e-5 x max |logit| ({scale:.3g})"


def test_spec_exercises_the_architecture_features(hf_pair):
    arch, _, _, spec = hf_pair
    if arch == "llama":
        assert spec.rope.scaling == "llama3" and not spec.tie_embeddings
    if arch == "qwen2":
        assert spec.qkv_bias and spec.tie_embeddings
    if arch == "qwen3":
        assert spec.qk_norm and spec.head_dim == 32
    if arch == "gemma3":
        assert spec.sandwich_norm and spec.sliding_window == 6 and spec.rope.local_theta == 1e4
        assert spec.layer_types == ("sliding", "sliding", "full", "sliding")
        assert spec.rope.scaling == "linear" and spec.final_softcap == 15.0


def test_batched_prefill_matches_transformers(hf_pair):
    """Three sequences in one batch, on scattered non-contiguous pages (up to 7 pages each)."""
    _, model, backend, spec = hf_pair
    rng = np.random.default_rng(7)
    lengths = (5, 13, 27)
    pages = rng.permutation(64)
    seqs = [rng.integers(0, spec.vocab_size, n) for n in lengths]
    reqs, used = [], 0
    for s in seqs:
        need = -(-len(s) // PAGE)
        reqs.append(kv_request(s, pages[used : used + need], PAGE))
        used += need
    for got, s in zip(probe_logits(run(backend, reqs), reqs), seqs, strict=True):
        _assert_close(got, _hf_logits(model, s))


def test_prefill_then_decode_matches_transformers(hf_pair):
    """Prefill 9 tokens for two requests, then 14 single-token decode steps past the window."""
    _, model, backend, spec = hf_pair
    rng = np.random.default_rng(11)
    total = 23
    seqs = [rng.integers(0, spec.vocab_size, total) for _ in range(2)]
    page_lists = [np.arange(70, 80)[::-1], np.array([3, 90, 17, 44, 5, 61, 28, 99])]
    refs = [_hf_logits(model, s) for s in seqs]
    prefill = [kv_request(s[:9], p, PAGE) for s, p in zip(seqs, page_lists, strict=True)]
    for got, ref in zip(probe_logits(run(backend, prefill), prefill), refs, strict=True):
        _assert_close(got, ref[:9])
    for t in range(9, total):
        step = [kv_request(s[t : t + 1], p, PAGE, start=t) for s, p in zip(seqs, page_lists, strict=True)]
        for got, ref in zip(probe_logits(run(backend, step), step), refs, strict=True):
            _assert_close(got, ref[t : t + 1])
