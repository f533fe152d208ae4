"""The torch backend's store of derived weights: a second load with the same ``weights_key`` reads
the stored layout instead of the checkpoint and computes exactly what the first load did."""

from __future__ import annotations

import numpy as np
import pytest

from backend_testkit import kv_request, probe_logits, random_weights, run
from pie_backend_torch import TorchBackend
from pie_backend_torch.options import resolve_options
from pie_backend_torch.weights_store import store_path
from pie_core.hookspec import BackendOptions
from torch_testkit import spec_of

REQUESTS = [kv_request(np.arange(9) * 7 % 89, np.arange(3), 4), kv_request(np.array([5]), np.array([7]), 1)]


def _options(key: str, dtype: str = "bfloat16", **extra) -> BackendOptions:
    return BackendOptions(page_size=4, kv_pages=64, host_pages=4, dtype=dtype, extra=extra, weights_key=key)


def _load(spec, options: BackendOptions, weights) -> TorchBackend:
    backend = TorchBackend()
    backend.pie_backend_load_model(spec, weights, options)
    return backend


def _untouchable():
    raise AssertionError("the checkpoint was read although the store had the weights")
    yield  # pragma: no cover - makes this a generator


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PIE_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("arch", "extra"),
    [
        ("llama", {"quant": "int4", "quant_max_tokens": 2}),  # int4 small batches + dense large ones
        ("qwen2", {"quant": "int4", "quant_large": "w8a8", "quant_max_tokens": 2}),  # + int8 x int8 large ones
        ("qwen2", {"quant": "int8", "quant_max_tokens": 0}),  # biases, tied head, int8 only
        ("qwen3", {"quant": "none"}),  # bf16 packed dense, Q/K norms
        ("gemma3", {"quant": "int4", "quant_max_tokens": 0}),  # sandwich norms; int4 falls back to int8
        ("qwen2", {"quant": "w8a8", "quant_large": "w8a8", "dtype": "float32"}),  # the AVX2 default
    ],
)
def test_second_load_reads_the_store_and_computes_the_same(arch, extra):
    spec = spec_of(arch)
    options = _options(f"key-{arch}", **extra)
    first = probe_logits(run(_load(spec, options, random_weights(spec)), REQUESTS), REQUESTS)
    assert store_path(resolve_options(options)).is_file()
    second = probe_logits(run(_load(spec, options, _untouchable()), REQUESTS), REQUESTS)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_the_key_and_the_layout_name_the_file():
    a = store_path(resolve_options(_options("k1", quant="int4")))
    assert a != store_path(resolve_options(_options("k2", quant="int4")))
    assert a != store_path(resolve_options(_options("k1", quant="int8")))
    assert a != store_path(resolve_options(_options("k1", quant="int4", quant_max_tokens=0)))
    assert a != store_path(resolve_options(_options("k1", quant="int4", quant_large="w8a8")))


def test_nothing_is_stored_without_a_key_plain_float32_or_when_switched_off(cache):
    spec = spec_of("qwen2")
    _load(spec, _options(""), random_weights(spec))
    _load(spec, _options("k", dtype="float32"), random_weights(spec))
    _load(spec, _options("k", weights_cache=False), random_weights(spec))
    assert not (cache / "torch").exists()  # not even its folder is made


def test_a_torn_or_foreign_file_is_ignored_and_rewritten():
    spec = spec_of("qwen2")
    options = _options("torn", quant="int8")
    want = probe_logits(run(_load(spec, options, random_weights(spec)), REQUESTS), REQUESTS)
    path = store_path(resolve_options(options))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match="ignoring the torch weights cache"):
        got = probe_logits(run(_load(spec, options, random_weights(spec)), REQUESTS), REQUESTS)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    _load(spec, options, _untouchable())  # it was rewritten
    other = spec_of("llama")  # a file of another model under the same name is refused
    with pytest.warns(RuntimeWarning, match="another model"):
        _load(other, options, random_weights(other))
