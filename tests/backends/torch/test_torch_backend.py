"""The torch backend as a plugin: registration, options, loading, page copies, bad input."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

import numpy as np
import pytest
import torch

from backend_testkit import kv_request, load_cpu, probe_logits, random_weights, run, tiny_spec
from pie_backend_torch import TorchBackend
from pie_backend_torch import options as options_module
from pie_backend_torch.linear import ByBatchSize, Dense, Int8Dynamic
from pie_backend_torch.options import resolve_options
from pie_backend_torch.kv_cache import page_bytes
from pie_core.engine.engine import default_backend_name
from pie_core.hookspec import CONTRACT_VERSION, BackendOptions, CopyKind, ProbeKind
from pie_core.plugins import available_backends, bind_plugin
from pie_core.scheduler.request import ProbeSpec
from torch_testkit import load_torch

TIGHT = dict(rtol=0, atol=1e-5)


def test_plugin_satisfies_the_hook_spec():
    pm = bind_plugin(TorchBackend(), "torch")
    info = pm.hook.pie_backend_info()
    assert info.name == "torch" and info.contract_version == CONTRACT_VERSION
    assert {"custom_mask", "logit_mask", "probes", "embeddings", "offload"} <= info.features


def test_entry_point_names_the_backend_and_it_becomes_the_default():
    try:
        distribution("pie-backend-torch")
    except PackageNotFoundError:
        pytest.skip("pie-backend-torch is not installed (pip install -e plugins/pie_backend_torch)")
    assert available_backends()["torch"].entry_point.load() is TorchBackend
    assert default_backend_name() == "torch"


def test_pool_is_sized_from_the_memory_budget_in_the_cache_dtype():
    spec = tiny_spec("qwen2")
    per_page = page_bytes(spec.num_layers, 8, spec.num_kv_heads, spec.head_dim, torch.bfloat16)
    assert per_page < page_bytes(spec.num_layers, 8, spec.num_kv_heads, spec.head_dim, torch.float32)
    caps = TorchBackend().pie_backend_load_model(
        spec, random_weights(spec), BackendOptions(page_size=8, dtype="bfloat16", kv_memory_bytes=per_page * 37 + 5)
    )
    assert caps.num_pages == 37 and caps.page_size == 8 and caps.dtype == "bfloat16" and caps.device == "cpu"
    assert caps.vocab_size == spec.vocab_size and caps.num_host_pages > 0


def test_explicit_page_counts_win():
    spec = tiny_spec("qwen2")
    caps = TorchBackend().pie_backend_load_model(spec, random_weights(spec), BackendOptions(kv_pages=12, host_pages=3))
    assert (caps.num_pages, caps.num_host_pages, caps.dtype) == (12, 3, "float32")


@pytest.mark.parametrize(
    "options, message",
    [
        (BackendOptions(dtype="int3"), "unsupported dtype"),
        (BackendOptions(extra={"quantize": "int8"}), "unknown torch backend option"),
        (BackendOptions(extra={"quant": "int2"}), "unsupported quant"),
        (BackendOptions(dtype="bfloat16", extra={"quant": "int4", "quant_large": "int4"}), "unsupported quant_large"),
        (BackendOptions(dtype="bfloat16", extra={"quant_large": "w8a8"}), "set quant too"),
        (BackendOptions(dtype="float32", extra={"quant": "int8"}), "bfloat16"),
        (BackendOptions(device="tpu"), "device"),
        (BackendOptions(extra={"kernels": "cuda"}), "kernels"),
        (BackendOptions(extra={"cuda_graphs": "maybe"}), "boolean"),
        (BackendOptions(page_size=0), "page_size"),
    ],
)
def test_bad_options_are_refused_with_what_to_use(options, message):
    spec = tiny_spec("qwen2")
    with pytest.raises(ValueError, match=message):
        TorchBackend().pie_backend_load_model(spec, random_weights(spec), options)


def test_triton_kernels_on_a_cpu_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    spec = tiny_spec("qwen2")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        TorchBackend().pie_backend_load_model(spec, random_weights(spec), BackendOptions(extra={"kernels": "triton"}))


@pytest.mark.parametrize(
    ("native_bf16", "kernels", "dtype", "quant", "quant_large"),
    [
        (True, True, "float32", "fit", "none"),
        (False, True, "float32", "fit", "none"),
        (True, False, "bfloat16", "int4", "w8a8"),
        (False, False, "float32", "w8a8", "w8a8"),
    ],
)
def test_auto_picks_the_fast_formats_of_the_cpu(monkeypatch, native_bf16, kernels, dtype, quant, quant_large):
    """fit (each tensor as precise as stored, float32 activations and cache, one layer for every
    batch size) where the backend's kernels build; without them, int4 decode where
    bf16 is native (AVX512-BF16) and float32 activations with w8a8 everywhere on other CPUs (AVX2),
    where bf16 is emulated and int4 is slower than int8."""
    from pie_backend_torch import native

    monkeypatch.setattr(options_module, "cpu_has_bf16", lambda: native_bf16)
    if not kernels:
        monkeypatch.setattr(native, "ops", lambda: None)
    spec = tiny_spec("qwen2")
    backend = TorchBackend()
    caps = backend.pie_backend_load_model(spec, random_weights(spec), BackendOptions(dtype="auto", kv_pages=4))
    assert caps.dtype == dtype
    config = backend._config
    assert config is not None and (config.quant, config.quant_large) == (quant, quant_large)
    q4_rows = 8 if kernels and native.ops().isa() == "avx2" else 64
    assert config.quant_max_tokens == {"q4": q4_rows, "fit": 0}.get(quant, 8)  # fit: no second layer
    assert backend._model is not None
    qkv = backend._model.weights.layers[0].qkv
    want = {"w8a8": Int8Dynamic, "fit": Dense}.get(quant, ByBatchSize)  # random weights fit no grid: float32
    assert isinstance(qkv, want)


def test_q4_keeps_64_token_batches_only_where_the_kernels_have_vnni(monkeypatch):
    """The plain AVX2 path (``PIE_TORCH_MARCH=x86-64-v3``, or a CPU without VNNI) keeps the general
    8: its batch-32 speed against fbgemm's w8a8 is not measured on an AVX2-only CPU."""
    from pie_backend_torch import native

    if native.ops() is None:
        pytest.skip(f"kernels not built here: {native.unavailable_reason()}")
    for isa, rows in (("avx512-vnni", 64), ("avx-vnni", 64), ("avx2", 8)):
        build = type("Build", (), {"isa": staticmethod(lambda isa=isa: isa)})()
        monkeypatch.setattr(native, "ops", lambda build=build: build)
        assert resolve_options(BackendOptions(dtype="float32", extra={"quant": "q4"})).quant_max_tokens == rows
        assert resolve_options(BackendOptions(dtype="float32", extra={"quant": "q4", "quant_max_tokens": 5})).quant_max_tokens == 5


def test_w8a8_takes_float32_activations_and_weight_only_kinds_do_not():
    assert resolve_options(BackendOptions(dtype="float32", extra={"quant": "w8a8"})).quant == "w8a8"
    with pytest.raises(ValueError, match="bfloat16"):
        resolve_options(BackendOptions(dtype="float32", extra={"quant": "int4"}))


def test_load_rejects_missing_misshapen_and_unexpected_weights():
    spec = tiny_spec("qwen2")
    weights = dict(random_weights(spec))
    missing = {k: v for k, v in weights.items() if k != "blk.1.ffn_up.weight"}
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight.*missing"):
        TorchBackend().pie_backend_load_model(spec, missing.items(), BackendOptions())
    bad = {**weights, "blk.0.attn_k.weight": np.zeros((3, 3), np.float32)}
    with pytest.raises(ValueError, match="blk.0.attn_k.weight.*shape"):
        TorchBackend().pie_backend_load_model(spec, bad.items(), BackendOptions())
    extra = {**weights, "blk.0.attn_output.bias": np.zeros(spec.hidden_size, np.float32)}
    with pytest.raises(ValueError, match="unexpected"):
        TorchBackend().pie_backend_load_model(spec, extra.items(), BackendOptions())


def test_hooks_need_a_loaded_model():
    with pytest.raises(RuntimeError, match="no model loaded"):
        TorchBackend().pie_backend_capabilities()
    with pytest.raises(RuntimeError, match="no model loaded"):
        TorchBackend().pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([0]), np.array([1]))


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 90, n).tolist()


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_copies_in_every_direction_preserve_the_context(kernels):
    spec = tiny_spec("gemma3")  # sliding layers: slot positions must travel with the pages
    backend = load_torch(spec, kv_pages=32, host_pages=8, kernels=kernels)
    src = np.array([3, 8, 1, 20], dtype=np.int32)
    run(backend, [kv_request(_tokens(14, 50), src, 4, probe_all=False)])
    step = lambda pages: [kv_request([7], pages, 4, start=14)]  # noqa: E731
    expected = probe_logits(run(backend, step(src)), step(src))[0]

    fork = np.array([30, 4, 12, 9], dtype=np.int32)
    backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, src, fork)
    np.testing.assert_allclose(probe_logits(run(backend, step(fork)), step(fork))[0], expected, **TIGHT)

    host = np.array([5, 0, 7, 2], dtype=np.int32)
    backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, src, host)
    run(backend, [kv_request(_tokens(16, 51), src, 4, probe_all=False)])  # clobber the device pages
    assert not np.allclose(probe_logits(run(backend, step(src)), step(src))[0], expected, **TIGHT)
    restored = np.array([11, 13, 15, 17], dtype=np.int32)
    backend.pie_backend_copy_pages(CopyKind.HOST_TO_DEVICE, host, restored)
    np.testing.assert_allclose(probe_logits(run(backend, step(restored)), step(restored))[0], expected, **TIGHT)


def test_copy_rejects_bad_page_ids():
    backend = load_torch(tiny_spec("qwen2"), kv_pages=8, host_pages=2)
    with pytest.raises(ValueError, match="out of range"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, np.array([1]), np.array([2]))
    with pytest.raises(ValueError, match="out of range"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([8]), np.array([0]))
    with pytest.raises(ValueError, match="as many"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([1, 2]), np.array([0]))
    with pytest.raises(ValueError, match="distinct"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([1, 2]), np.array([0, 0]))


def test_forward_rejects_write_slots_outside_the_pages():
    backend = load_torch(tiny_spec("qwen2"))
    req = kv_request([1, 2], np.arange(1), 4)
    req.write_slots = np.array([0, 4], dtype=np.int32)
    with pytest.raises(ValueError, match="kv_write_slots"):
        run(backend, [req])


def test_embedding_probes_read_the_final_hidden_state_like_the_reference():
    spec = tiny_spec("gemma3")
    probes = (ProbeSpec(index=2, kind=ProbeKind.EMBEDDING), ProbeSpec(index=0, kind=ProbeKind.EMBEDDING))
    req = [kv_request(_tokens(4, 3), np.arange(1), 4, probes=probes, probe_all=False)]
    want = run(load_cpu(spec), req).probes
    got = run(load_torch(spec), req).probes
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == (spec.hidden_size,)
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_a_pass_with_nothing_to_read_returns_nothing():
    out = run(load_torch(tiny_spec("qwen2")), [kv_request([1, 2, 3], np.arange(1), 4, probe_all=False)])
    assert out.tokens.shape == (0,) and out.probes == ()


def test_loading_says_what_each_one_time_step_is_doing():
    """The CLI's loading bar shows these lines (``pie_core.backend_kit.step_listener``) instead of
    one silent "backend preparing the weights"."""
    from pie_core.backend_kit import step_listener

    spec = tiny_spec("qwen2")
    seen: list[str] = []
    with step_listener(seen.append):
        TorchBackend().pie_backend_load_model(spec, random_weights(spec), BackendOptions(dtype="float32", kv_pages=4))
    assert seen[0].endswith("embedding and output head")
    assert [s.rsplit(": ", 1)[1] for s in seen[1:]] == [f"layer {i}/{spec.num_layers}" for i in range(1, spec.num_layers + 1)]
