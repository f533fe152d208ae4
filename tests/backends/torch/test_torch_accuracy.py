"""The default torch path is the model (issue 35): on the default GGUF its greedy tokens are
transformers' float32 tokens, its perplexity of a fixed passage stays near float32's, and a
request's logits are bit for bit the same alone and inside batches of 2, 7 and 32 mixed
prefill/decode requests. (llama.cpp is not a test dependency: ``benchmarks/accuracy.py`` compares
with it where ``llama-cpp-python`` is installed; on the three prompts its greedy tokens and ours
both equal transformers'.) ``benchmarks/accuracy.py`` measures the same for every format."""

from __future__ import annotations

import numpy as np
import pytest

from accuracy_kit import PROMPTS, backend_greedy, backend_logits, hf_greedy, hf_logits, passage_ids, perplexity, prompt_ids
from backend_testkit import kv_request, probe_logits, run

pytestmark = pytest.mark.model

GREEDY_TOKENS = 20


def test_the_default_is_fit_with_float32_activations(default_torch):
    _, backend = default_torch
    assert backend._config.quant == "fit" and backend.pie_backend_capabilities().dtype == "float32"
    weights = backend._model.weights  # two-step activations where the inputs carry outlier channels
    assert all(layer.qkv.fine and layer.ffn_down.fine for layer in weights.layers)
    assert not any(getattr(layer.gate_up, "fine", False) or getattr(layer.attn_output, "fine", False) for layer in weights.layers)


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_default_greedy_tokens_equal_transformers_fp32(default_torch, hf_model, prompt):
    source, backend = default_torch
    ids = prompt_ids(source, PROMPTS[prompt])
    ours = backend_greedy(backend, ids, GREEDY_TOKENS)
    ref = hf_greedy(hf_model, ids, GREEDY_TOKENS)
    first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    assert ours == ref, f"diverges at token {first}: ours {source.tokenizer.decode(ours)!r}, transformers {source.tokenizer.decode(ref)!r}"


@pytest.mark.parametrize("pass_size", [8, None])
def test_default_perplexity_is_within_0_2_percent_of_float32(default_torch, hf_model, pass_size):
    """Issue 35's goal: +0.2% of transformers float32, in passes of 8 (decode formats) and in one
    pass. Measured (docs/performance.md): +0.04% and -0.12% with two-step activations in the Q/K/V
    and down projections, +0.12% and +0.30% without them (the one-pass case fails then)."""
    source, backend = default_torch
    ids = passage_ids(source.tokenizer)
    ref = perplexity(hf_logits(hf_model, ids), ids)
    ours = perplexity(backend_logits(backend, ids, pass_size or len(ids)), ids)
    assert ours <= ref * 1.002, f"perplexity {ours:.3f} vs transformers float32 {ref:.3f} ({ours / ref - 1:+.2%})"


def _neighbours(backend, ids: np.ndarray, count: int, seed: int) -> list:
    """``count`` requests on pages 8.. : prefill chunks of 2..40 tokens, and decode steps after
    prefixes of 1..120 tokens (prefilled here, together, in a pass of their own)."""
    rng = np.random.default_rng(seed)
    page, out, prefixes = 8, [], []
    for i in range(count):
        if i % 3 == 0:
            n = int(rng.integers(2, 40))
            out.append(kv_request(ids[5 : 5 + n], list(range(page, page + 3)), 16))
            page += 3
        else:
            n = int(rng.integers(1, 120))
            pages = list(range(page, page + n // 16 + 1))
            page += len(pages)
            prefixes.append(kv_request(ids[:n], pages, 16, probe_all=False))
            out.append(kv_request(ids[n : n + 1], pages, 16, start=n))
    if prefixes:
        run(backend, prefixes)
    return out


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_a_request_s_logits_are_bit_identical_alone_and_in_batches(default_torch, kind):
    source, backend = default_torch
    ids = passage_ids(source.tokenizer)
    run(backend, [kv_request(ids[:20], [0, 1], 16, probe_all=False)])  # the target's prefix
    target = kv_request(ids[20:21] if kind == "decode" else ids[20:29], [0, 1], 16, start=20)
    alone = probe_logits(run(backend, [target]), [target])[0]
    for size in (2, 7, 32):
        others = _neighbours(backend, ids, size - 1, seed=size)
        batch = others[: size // 2] + [target] + others[size // 2 :]
        got = probe_logits(run(backend, batch), batch)[size // 2]
        assert np.array_equal(got, alone), f"batch of {size}: max |Δ| {np.abs(got - alone).max():.3g}"
