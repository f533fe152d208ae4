"""The ONNX Runtime session of one model and the KV cache it updates in place.

Each layer's K and V cache is one ``OrtValue`` ``[slots, kv_heads, head_dim]`` on the provider's
device, bound as both the input and the output of the graph's ``ScatterND`` (ONNX Runtime skips
the copy when both are the same buffer), so a pass writes only its own tokens' slots. Page
copies run through two tiny graphs, ``take`` (Gather) and ``put`` (ScatterND in place), on the
same provider; the host pool is numpy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from pie_backend_tensorrt.export import GraphSource, export_dir
from pie_backend_tensorrt.graph import OPSET, cache_names
from pie_backend_tensorrt.options import TrtConfig
from pie_backend_tensorrt.providers import check_session, provider_options

__all__ = ["GraphSession"]


def _copy_graphs(dtype: int) -> tuple[bytes, bytes]:
    vi = helper.make_tensor_value_info
    take = helper.make_graph(
        [helper.make_node("Gather", ["cache", "slots"], ["rows"], axis=0)], "take",
        [vi("cache", dtype, ["C", "K", "D"]), vi("slots", TensorProto.INT64, ["X"])],
        [vi("rows", dtype, ["X", "K", "D"])])
    put = helper.make_graph(
        [helper.make_node("ScatterND", ["cache", "slots", "rows"], ["cache_out"])], "put",
        [vi("cache", dtype, ["C", "K", "D"]), vi("slots", TensorProto.INT64, ["X", 1]), vi("rows", dtype, ["X", "K", "D"])],
        [vi("cache_out", dtype, ["C", "K", "D"])])
    out = []
    for g in (take, put):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 10
        out.append(m.SerializeToString())
    return out[0], out[1]


class GraphSession:
    """Runs the model graph on one provider against its own KV cache."""

    def __init__(self, source: GraphSource, config: TrtConfig, *, slots: int, num_layers: int, kv_heads: int,
                 head_dim: int, sliding: bool) -> None:
        import onnxruntime as ort

        self._ort = ort
        self.config = config
        so = ort.SessionOptions()
        if config.threads is not None:
            so.intra_op_num_threads = config.threads
        so.log_severity_level = 3
        providers = list(config.providers)
        opts = provider_options(config, export_dir(), sliding=sliding, cache_slots=slots, kv_heads=kv_heads,
                                head_dim=head_dim, num_layers=num_layers)
        model = str(source) if isinstance(source, Path) else source
        self.session = ort.InferenceSession(model, so, providers=providers, provider_options=opts)
        check_session(self.session, config)
        self.device = "cpu" if config.provider == "cpu" else "cuda"
        np_dtype = np.float16 if config.dtype == "float16" else np.float32
        shape = (slots, kv_heads, head_dim)
        self._keep: list[np.ndarray] = []  # numpy buffers that CPU OrtValues share
        self.caches: list[tuple[Any, Any]] = []
        for _ in range(num_layers):
            pair = []
            for _kv in range(2):
                if self.device == "cpu":
                    buf = np.zeros(shape, dtype=np_dtype)  # pages are committed by the OS on first write
                    self._keep.append(buf)
                    pair.append(ort.OrtValue.ortvalue_from_numpy(buf))
                else:
                    pair.append(ort.OrtValue.ortvalue_from_shape_and_type(shape, np_dtype, "cuda", config.device_id))
            self.caches.append((pair[0], pair[1]))
        small = ort.SessionOptions()
        small.log_severity_level = 3
        onnx_dtype = TensorProto.FLOAT16 if config.dtype == "float16" else TensorProto.FLOAT
        take, put = _copy_graphs(onnx_dtype)
        copy_providers = [p for p in providers if p != "TensorrtExecutionProvider"]
        copy_opts = [o for p, o in zip(providers, opts) if p != "TensorrtExecutionProvider"]
        self._take = ort.InferenceSession(take, small, providers=copy_providers, provider_options=copy_opts)
        self._put = ort.InferenceSession(put, small, providers=copy_providers, provider_options=copy_opts)
        self.np_dtype = np_dtype

    def run(self, feed: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """One pass: writes this batch's K/V into the cache and returns ``(logits, hidden)``."""
        binding = self.session.io_binding()
        binding.bind_output("logits", "cpu")  # outputs come back in the order they are bound
        binding.bind_output("hidden", "cpu")
        for name, value in feed.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for layer, (k, v) in enumerate(self.caches):
            k_in, v_in, k_out, v_out = cache_names(layer)
            binding.bind_ortvalue_input(k_in, k)
            binding.bind_ortvalue_input(v_in, v)
            binding.bind_ortvalue_output(k_out, k)
            binding.bind_ortvalue_output(v_out, v)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        return outputs[0].numpy(), outputs[1].numpy()

    def take(self, layer: int, kind: int, slots: np.ndarray) -> np.ndarray:
        """Host copy of cache rows ``slots`` (``kind`` 0 = K, 1 = V) of one layer."""
        binding = self._take.io_binding()
        binding.bind_ortvalue_input("cache", self.caches[layer][kind])
        binding.bind_cpu_input("slots", slots.astype(np.int64))
        binding.bind_output("rows", "cpu")
        self._take.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    def put(self, layer: int, kind: int, slots: np.ndarray, rows: np.ndarray) -> None:
        """Write host ``rows`` into cache ``slots`` of one layer, in place."""
        cache = self.caches[layer][kind]
        binding = self._put.io_binding()
        binding.bind_ortvalue_input("cache", cache)
        binding.bind_cpu_input("slots", slots.astype(np.int64)[:, None])
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=self.np_dtype))
        binding.bind_ortvalue_output("cache_out", cache)
        self._put.run_with_iobinding(binding)
