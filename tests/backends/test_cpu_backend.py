"""The NumPy backend as a plugin: registration, loading, capabilities, and the hooks end to end."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

import numpy as np
import pytest

from backend_testkit import kv_request, load_cpu, random_weights, run, tiny_spec
from pie_backend_cpu import CpuBackend
from pie_backend_cpu.kv_store import page_bytes
from pie_core.hookspec import CONTRACT_VERSION, BackendOptions, ProbeKind, SamplerKind
from pie_core.plugins import available_backends, bind_plugin
from pie_core.scheduler.request import ProbeSpec, SampleSpec


def test_plugin_satisfies_the_hook_spec():
    pm = bind_plugin(CpuBackend(), "cpu")
    info = pm.hook.pie_backend_info()
    assert info.name == "cpu" and info.contract_version == CONTRACT_VERSION


def test_entry_point_names_the_backend():
    try:
        distribution("pie-backend-cpu")
    except PackageNotFoundError:
        pytest.skip("pie-backend-cpu is not installed (pip install -e plugins/pie_backend_cpu)")
    entry = available_backends()["cpu"]
    assert entry.entry_point.load() is CpuBackend


def test_pool_is_sized_from_the_memory_budget():
    spec = tiny_spec("qwen2")
    per_page = page_bytes(spec.num_layers, 8, spec.num_kv_heads, spec.head_dim)
    caps = CpuBackend().pie_backend_load_model(
        spec, random_weights(spec), BackendOptions(page_size=8, kv_memory_bytes=per_page * 37 + 5)
    )
    assert caps.num_pages == 37 and caps.page_size == 8 and caps.num_host_pages > 0
    assert caps.vocab_size == spec.vocab_size and caps.dtype == "float32"
    assert {"custom_mask", "logit_mask", "probes"} <= caps.features
    assert {"adapters", "zo"} <= caps.features


def test_explicit_page_counts_win():
    spec = tiny_spec("qwen2")
    caps = CpuBackend().pie_backend_load_model(
        spec, random_weights(spec), BackendOptions(kv_pages=12, host_pages=3)
    )
    assert (caps.num_pages, caps.num_host_pages) == (12, 3)


def test_load_rejects_missing_misshapen_and_unexpected_weights():
    spec = tiny_spec("qwen2")
    weights = dict(random_weights(spec))
    missing = {k: v for k, v in weights.items() if k != "blk.1.ffn_up.weight"}
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight.*missing"):
        CpuBackend().pie_backend_load_model(spec, missing.items(), BackendOptions())
    bad = {**weights, "blk.0.attn_k.weight": np.zeros((3, 3), np.float32)}
    with pytest.raises(ValueError, match="blk.0.attn_k.weight.*shape"):
        CpuBackend().pie_backend_load_model(spec, bad.items(), BackendOptions())
    extra = {**weights, "blk.0.attn_output.bias": np.zeros(spec.hidden_size, np.float32)}
    with pytest.raises(ValueError, match="unexpected"):
        CpuBackend().pie_backend_load_model(spec, extra.items(), BackendOptions())
    with pytest.raises(ValueError, match="device"):
        CpuBackend().pie_backend_load_model(spec, weights.items(), BackendOptions(device="cuda"))


def test_hooks_need_a_loaded_model():
    with pytest.raises(RuntimeError, match="no model loaded"):
        CpuBackend().pie_backend_capabilities()


def test_argmax_and_probes_agree_with_the_logits():
    spec = tiny_spec("gemma3")
    backend = load_cpu(spec)
    tokens = np.random.default_rng(0).integers(0, spec.vocab_size, 6)
    req = kv_request(
        tokens,
        np.arange(2),
        4,
        probe_all=False,
        samples=(SampleSpec(index=5), SampleSpec(index=2)),
        probes=(
            ProbeSpec(index=5, kind=ProbeKind.LOGITS),
            ProbeSpec(index=2, kind=ProbeKind.LOGITS),
            ProbeSpec(index=5, kind=ProbeKind.DISTRIBUTION, temperature=0.7, k=5),
            ProbeSpec(index=5, kind=ProbeKind.LOGPROBS, token_ids=(1, 2, 3)),
            ProbeSpec(index=5, kind=ProbeKind.ENTROPY),
        ),
    )
    out = run(backend, [req])
    last, third, (ids, probs), logprobs, entropy = out.probes
    assert out.tokens.tolist() == [int(np.argmax(last)), int(np.argmax(third))]
    z = last.astype(np.float64)
    p = np.exp((z - z.max()) / 0.7) / np.exp((z - z.max()) / 0.7).sum()  # softmax(logits / 0.7)
    np.testing.assert_array_equal(ids, np.argsort(-p, kind="stable")[:5])
    np.testing.assert_allclose(probs, p[ids], rtol=1e-5)
    log_q = z - z.max() - np.log(np.exp(z - z.max()).sum())  # log_softmax(logits), no temperature
    np.testing.assert_allclose(logprobs, log_q[[1, 2, 3]], rtol=1e-5)
    assert entropy == pytest.approx(float(-(np.exp(log_q) * log_q).sum()), rel=1e-5)


def test_sampling_on_the_model_honours_logit_masks():
    spec = tiny_spec("qwen2")
    backend = load_cpu(spec)
    allowed = np.zeros(spec.vocab_size, bool)
    allowed[[4, 40, 77]] = True
    packed = np.packbits(allowed, bitorder="little")
    samples = tuple(
        SampleSpec(
            index=0,
            kind=kind,
            temperature=1.5,
            top_k=2,
            top_p=0.9,
            min_p=0.01,
            draws=50,
            seed=i + 1,
            logit_mask=packed,
        )
        for i, kind in enumerate(SamplerKind)
    )
    out = run(backend, [kv_request([3], np.arange(1), 4, probe_all=False, samples=samples)])
    assert len(out.tokens) == 50 * len(samples)
    assert set(out.tokens.tolist()) <= {4, 40, 77}


def test_a_pass_with_nothing_to_read_returns_nothing():
    backend = load_cpu(tiny_spec("qwen2"))
    out = run(backend, [kv_request([1, 2, 3], np.arange(1), 4, probe_all=False)])
    assert out.tokens.shape == (0,) and out.probes == ()
