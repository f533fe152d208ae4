"""Shared helpers for the backend tests: tiny models, loaded backends, and request builders."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from pie_core.hookspec import BackendOptions, ProbeKind
from pie_core.models.spec import ModelSpec, RopeConfig
from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.request import ForwardRequest, ProbeSpec, SampleSpec
from pie_backend_cpu import CpuBackend

__all__ = [
    "tiny_spec",
    "random_weights",
    "load_cpu",
    "kv_request",
    "run",
    "probe_logits",
]


def tiny_spec(kind: str = "qwen2") -> ModelSpec:
    """A small spec of each flavour the forward distinguishes.

    ``qwen2``: GQA, QKV bias, tied embeddings. ``gemma3``: sandwich norms, QK norm, gelu,
    embed scale, sliding window 5 on layers 0 and 1, local RoPE base, final softcap.
    """
    if kind == "qwen2":
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
    if kind == "gemma3":
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
    raise ValueError(kind)


def random_weights(spec: ModelSpec, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """Canonical-name random weights for ``spec`` (norm weights around 1)."""
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


def load_cpu(spec: ModelSpec, weights=None, page_size: int = 4, kv_pages: int = 256, host_pages: int = 16):
    """A CpuBackend with ``spec`` loaded (random weights unless given)."""
    backend = CpuBackend()
    backend.pie_backend_load_model(
        spec,
        random_weights(spec) if weights is None else weights,
        BackendOptions(page_size=page_size, kv_pages=kv_pages, host_pages=host_pages),
    )
    return backend


def kv_request(
    tokens: Sequence[int],
    pages: Sequence[int],
    page_size: int,
    start: int = 0,
    positions: Sequence[int] | None = None,
    kv_len: int | None = None,
    mask: np.ndarray | None = None,
    probe_all: bool = True,
    samples: tuple[SampleSpec, ...] = (),
    probes: tuple[ProbeSpec, ...] = (),
) -> ForwardRequest:
    """A request writing ``tokens`` at slots ``start, start+1, ...`` of the pages given.

    The KV length defaults to ``start + len(tokens)`` and positions to the slots. With
    ``probe_all`` every input row gets a LOGITS probe (after ``probes``).
    """
    n = len(tokens)
    slots = np.arange(start, start + n, dtype=np.int32)
    length = start + n if kv_len is None else kv_len
    used = -(-length // page_size)
    page_ids = np.asarray(pages[:used], dtype=np.int32)
    if len(page_ids) < used:
        raise ValueError(f"{used} pages needed, {len(pages)} given")
    extra = tuple(ProbeSpec(index=i, kind=ProbeKind.LOGITS) for i in range(n)) if probe_all else ()
    return ForwardRequest(
        token_ids=np.asarray(tokens, dtype=np.int32),
        positions=slots.copy() if positions is None else np.asarray(positions, dtype=np.int32),
        page_ids=page_ids,
        last_page_len=length - (used - 1) * page_size,
        write_slots=slots,
        attention_mask=mask,
        samples=samples,
        probes=probes + extra,
    )


def run(backend, requests: Sequence[ForwardRequest]):
    """Assemble ``requests`` into one batch and run it; returns the BatchOutput."""
    caps = backend.pie_backend_capabilities()
    return backend.pie_backend_forward(assemble(list(requests), caps.vocab_size))


def probe_logits(output, requests: Sequence[ForwardRequest]) -> list[np.ndarray]:
    """Per request, the ``[n, vocab]`` logits of its trailing ``probe_all`` LOGITS probes."""
    out, q = [], 0
    for r in requests:
        values = output.probes[q : q + len(r.probes)]
        q += len(r.probes)
        out.append(np.stack(values[len(values) - r.num_tokens :]))
    return out
