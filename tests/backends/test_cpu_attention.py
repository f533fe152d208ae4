"""The backend's forward against a direct, loop-per-token transcription of the model equations.

This covers what transformers cannot check for us: attention-logit soft-capping (transformers'
Gemma 3 ignores it) and a grouped-query layout with many query heads per KV head.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from backend_testkit import kv_request, load_cpu, probe_logits, random_weights, run, tiny_spec
from pie_core.models.spec import ModelSpec


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + eps) * w


def _rope(x: np.ndarray, pos: int, theta: float, factor: float) -> np.ndarray:
    half = len(x) // 2
    out = np.empty_like(x)
    for i in range(half):
        angle = pos / factor / theta ** (2 * i / len(x))
        c, s = math.cos(angle), math.sin(angle)
        out[i] = x[i] * c - x[i + half] * s
        out[i + half] = x[i + half] * c + x[i] * s
    return out


def _reference_logits(spec: ModelSpec, w: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """Plain per-token forward of one sequence (positions 0..n-1), float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    hd, eps = spec.head_dim, spec.rms_norm_eps
    group = spec.num_heads // spec.num_kv_heads
    xs = [w["token_embd.weight"][t] * spec.embed_scale for t in tokens]
    for layer in range(spec.num_layers):
        p = f"blk.{layer}."
        sliding = spec.is_sliding(layer)
        theta = spec.rope.local_theta if sliding else spec.rope.theta
        factor = 1.0 if sliding or spec.rope.scaling == "none" else spec.rope.factor
        qs, ks, vs = [], [], []
        for t, x in enumerate(xs):
            h = _rms(x, w[p + "attn_norm.weight"], eps)
            q = (w[p + "attn_q.weight"] @ h).reshape(spec.num_heads, hd)
            k = (w[p + "attn_k.weight"] @ h).reshape(spec.num_kv_heads, hd)
            v = (w[p + "attn_v.weight"] @ h).reshape(spec.num_kv_heads, hd)
            if spec.qk_norm:
                q = np.stack([_rms(r, w[p + "attn_q_norm.weight"], eps) for r in q])
                k = np.stack([_rms(r, w[p + "attn_k_norm.weight"], eps) for r in k])
            qs.append(np.stack([_rope(r, t, theta, factor) for r in q]))
            ks.append(np.stack([_rope(r, t, theta, factor) for r in k]))
            vs.append(v)
        new = []
        for t, x in enumerate(xs):
            heads = []
            for head in range(spec.num_heads):
                kv = head // group
                visible = [j for j in range(t + 1) if not sliding or j > t - spec.sliding_window]
                scores = np.array([qs[t][head] @ ks[j][kv] * spec.scale for j in visible])
                if spec.attn_softcap is not None:
                    scores = np.tanh(scores / spec.attn_softcap) * spec.attn_softcap
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                heads.append(sum(pr * vs[j][kv] for pr, j in zip(probs, visible, strict=True)))
            o = w[p + "attn_output.weight"] @ np.concatenate(heads)
            if spec.sandwich_norm:
                o = _rms(o, w[p + "post_attention_norm.weight"], eps)
            x = x + o
            h = _rms(x, w[p + "ffn_norm.weight"], eps)
            gate = w[p + "ffn_gate.weight"] @ h
            act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
            f = w[p + "ffn_down.weight"] @ (act * (w[p + "ffn_up.weight"] @ h))
            if spec.sandwich_norm:
                f = _rms(f, w[p + "post_ffw_norm.weight"], eps)
            new.append(x + f)
        xs = new
    head = w["token_embd.weight"] if spec.tie_embeddings else w["output.weight"]
    logits = np.stack([head @ _rms(x, w["output_norm.weight"], eps) for x in xs])
    if spec.final_softcap is not None:
        logits = np.tanh(logits / spec.final_softcap) * spec.final_softcap
    return logits


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_forward_with_attention_softcap_matches_direct_equations(num_kv_heads):
    spec = dataclasses.replace(tiny_spec("gemma3"), attn_softcap=3.0, num_kv_heads=num_kv_heads)
    weights = dict(random_weights(spec, seed=3))
    tokens = np.random.default_rng(4).integers(0, spec.vocab_size, 11)
    backend = load_cpu(spec, weights=iter(weights.items()))
    prefill = [kv_request(tokens[:8], np.array([6, 1, 9]), 4)]
    decode = [kv_request(tokens[8:9], np.array([6, 1, 9]), 4, start=8)]
    got = np.concatenate([probe_logits(run(backend, r), r)[0] for r in (prefill, decode)])
    ref = _reference_logits(spec, weights, tokens[:9])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # The cap matters: the same weights without it give different logits.
    uncapped = load_cpu(dataclasses.replace(spec, attn_softcap=None), weights=iter(weights.items()))
    assert not np.allclose(probe_logits(run(uncapped, prefill), prefill)[0], ref[:8], atol=1e-3)
