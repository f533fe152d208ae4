"""Accuracy of the torch backend's weight formats against its float32 forward (= the cpu backend).

Prefills a 57-token code prompt of the default model through each format and compares the
logits at every position with float32: top-1 agreement, mean and max KL(float32 || format).

    python benchmarks/torch_accuracy.py                         # the formats of docs/performance.md
    python benchmarks/torch_accuracy.py "w8a8:quant=w8a8,quant_max_tokens=0"   # NAME:KEY=VALUE,...

Each format is a set of torch backend options (``pie_backend_torch.options``) plus ``dtype``
(default bfloat16), or, with ``backend=tensorrt``, options of the tensorrt backend (its ONNX
graph on ONNX Runtime)::

    python benchmarks/torch_accuracy.py "ort-int4:backend=tensorrt,provider=cpu,quant=int4,dtype=float32"
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backends"))

from backend_testkit import kv_request, probe_logits, run  # noqa: E402
from pie_backend_torch import TorchBackend  # noqa: E402
from pie_core.hookspec import BackendOptions  # noqa: E402
from pie_core.models.registry import resolve_model  # noqa: E402

PROMPT = (
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[len(arr) // 2]\n"
    "    left = [x for x in arr if x < pivot]\n    middle = [x for x in arr if x == pivot]\n"
)
FORMATS = [
    "bf16:quant=none",
    "w8a8:quant=w8a8,quant_max_tokens=0",
    "int4:quant=int4,quant_max_tokens=0",
]


def _parse(arg: str) -> tuple[str, dict[str, object]]:
    name, _, rest = arg.partition(":")
    extra: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        extra[key] = int(value) if value.isdigit() else value
    return name, extra


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main(argv: list[str]) -> int:
    source = resolve_model(None)
    ids = np.array(source.tokenizer.encode(PROMPT), dtype=np.int64)
    requests = [kv_request(ids, np.arange((len(ids) + 15) // 16), 16)]

    def logits(dtype: str, extra: dict[str, object]) -> np.ndarray:
        if extra.pop("backend", "torch") == "tensorrt":
            from pie_backend_tensorrt import TensorrtBackend

            backend = TensorrtBackend()
        else:
            backend = TorchBackend()
        options = BackendOptions(page_size=16, kv_pages=64, host_pages=4, dtype=dtype, extra=extra,
                                 weights_key=source.cache_key)
        backend.pie_backend_load_model(source.spec, source.weights(), options)
        return probe_logits(run(backend, requests), requests)[0].astype(np.float64)

    ref = _log_softmax(logits("float32", {"quant": "none"}))
    print(f"{len(ids)} prompt tokens; reference: float32\n")
    print("| format | top-1 agreement | mean KL | max KL |\n|---|---:|---:|---:|")
    for name, extra in map(_parse, argv or FORMATS):
        got = _log_softmax(logits(str(extra.pop("dtype", "bfloat16")), extra))
        kl = (np.exp(ref) * (ref - got)).sum(-1)
        top1 = (ref.argmax(-1) == got.argmax(-1)).mean()
        print(f"| {name} | {top1 * 100:.1f}% | {kl.mean():.4f} | {kl.max():.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
