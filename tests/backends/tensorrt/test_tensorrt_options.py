"""Options and providers of the tensorrt backend: nothing unknown passes, nothing missing is faked,
and the TensorRT shape profile covers every dynamic input of the graph."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.models import random_weights, tiny_spec
from pie_core.backend_kit import BackendOptions
from pie_backend_tensorrt import providers
from pie_backend_tensorrt.backend import TensorrtBackend
from pie_backend_tensorrt.graph import build_graph
from pie_backend_tensorrt.options import resolve_options


def _config(**extra):
    return resolve_options(BackendOptions(dtype="auto", extra=extra), 256)


def test_unknown_option_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown tensorrt backend option.*provdier"):
        _config(provdier="cpu")


@pytest.mark.parametrize(("extra", "match"), [
    ({"provider": "metal"}, "provider must be one of"),
    ({"quant": "int3"}, "quant must be"),
    ({"block_size": 24}, "block_size must be"),
    ({"threads": 0}, "threads must be >= 1"),
    ({"trt_max_tokens": "many"}, "must be an integer"),
])
def test_bad_option_values_are_refused(extra, match):
    with pytest.raises(ValueError, match=match):
        _config(**extra)


def test_auto_dtype_is_float32_on_the_cpu_provider_and_float16_on_the_gpu_ones():
    assert _config(provider="cpu").dtype == "float32"
    assert _config(provider="cuda").dtype == "float16"
    assert _config().provider == "tensorrt" and _config().dtype == "float16"
    with pytest.raises(ValueError, match="float32 or float16"):
        resolve_options(BackendOptions(dtype="bfloat16", extra={"provider": "cpu"}), 256)


def test_a_cuda_device_with_the_cpu_provider_is_a_contradiction():
    with pytest.raises(ValueError, match="drop one of them"):
        resolve_options(BackendOptions(device="cuda:1", extra={"provider": "cpu"}), 256)
    assert resolve_options(BackendOptions(device="cuda:1", extra={"provider": "cuda"}), 256).device_id == 1


@pytest.mark.parametrize(("provider", "names"), [("tensorrt", "TensorRT"), ("cuda", "CUDA")])
def test_a_missing_gpu_provider_is_refused_before_any_weight_is_read(monkeypatch, provider, names):
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    read = []

    def weights():
        read.append(True)
        yield from random_weights(tiny_spec())

    with pytest.raises(ValueError) as info:
        TensorrtBackend().pie_backend_load_model(tiny_spec(), weights(), BackendOptions(extra={"provider": provider}))
    message = str(info.value)
    assert names in message and "pip install 'pie-backend-tensorrt[gpu]'" in message
    assert "--backend-option provider=cpu" in message
    assert not read


def test_a_session_that_dropped_the_provider_asked_for_is_refused():
    class Session:
        def get_providers(self):
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    with pytest.raises(providers.ProviderMissing, match="could not start TensorrtExecutionProvider"):
        providers.check_session(Session(), _config())
    providers.check_session(Session(), _config(provider="cuda"))


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_the_tensorrt_profile_names_every_dynamic_input_of_the_graph(arch):
    spec = tiny_spec(arch)
    graph = build_graph(spec, random_weights(spec), "float16").graph
    sliding = arch == "gemma3"
    config = _config(trt_max_tokens=512, trt_max_kv=2048, trt_max_requests=32)
    opts = providers.provider_options(config, __import__("pathlib").Path("/tmp"), sliding=sliding, cache_slots=4096,
                                      kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                                      num_layers=spec.num_layers)[0]
    assert opts["trt_fp16_enable"] is True and opts["trt_engine_cache_enable"] is True
    shapes = {}
    for which in ("min", "opt", "max"):
        shapes[which] = {name: [int(d) for d in dims.split("x")] for name, dims in
                         (item.split(":") for item in opts[f"trt_profile_{which}_shapes"].split(","))}
    inputs = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
              for i in graph.input}
    assert set(shapes["max"]) == set(inputs)
    for name, dims in inputs.items():
        lo, mid, hi = (np.array(shapes[w][name]) for w in ("min", "opt", "max"))
        assert len(lo) == len(dims) and (lo <= mid).all() and (mid <= hi).all(), name
        for d, value in zip(dims, hi):
            assert d is None or d == value, (name, dims, hi)
    assert shapes["max"]["input_ids"] == [512] and shapes["max"]["kv_slots_a"] == [32, 2048]


def test_pie_backends_says_which_providers_are_here_and_where_each_was_verified():
    import json
    import subprocess
    import sys

    import onnxruntime

    proc = subprocess.run([sys.executable, "-m", "pie_core.cli.main", "backends", "--json"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    row = next(r for r in json.loads(proc.stdout) if r["name"] == "tensorrt")
    assert row["status"] == "ok"
    here = onnxruntime.get_available_providers()
    for provider, where in providers.VERIFIED.items():
        short = provider.removesuffix("ExecutionProvider")
        assert f"{short}: {'here' if provider in here else 'absent'}, {where}" in row["description"]
    default = "available" if "TensorrtExecutionProvider" in here else "NOT available here: pass provider=cpu"
    assert f"default provider tensorrt ({default})" in row["description"]
