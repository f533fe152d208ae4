"""What the engine asked for, resolved into the ONNX Runtime execution providers this backend runs.

Keys of ``BackendOptions.extra`` (all optional):

- ``provider``: ``"tensorrt"`` (the default: TensorRT EP, with CUDA EP and CPU EP for nodes
  TensorRT does not take), ``"cuda"`` (CUDA EP, then CPU EP) or ``"cpu"`` (CPU EP only: the same
  graph on the CPU; this is how CI verifies it). Nothing falls back silently: a provider that is
  asked for and not present is an error naming what to install.
- ``quant``: ``"none"`` (weights in the graph's dtype, the default) or ``"int4"``: every MatMul
  with constant weights becomes ONNX Runtime's ``MatMulNBits`` (4-bit blocks of ``block_size``,
  int8 activations on the CPU), made by ONNX Runtime's own quantizer.
- ``block_size``: 4-bit block length (16, 32, 64 or 128; default 32).
- ``threads``: intra-op threads of the session (default: ONNX Runtime's choice).
- ``trt_max_tokens``: the largest batch (tokens) a TensorRT engine is built for (default the
  backend's ``max_batch_tokens``); with ``trt_max_kv`` (key slots per request, default 4096) and
  ``trt_max_requests`` it bounds the shape profile. Engines are built once per profile and kept
  under ``<pie cache>/onnx/trt``.

``BackendOptions.device`` ``"cuda:N"`` picks the GPU of the GPU providers (default 0); ``dtype``
``"auto"`` is float16 on the GPU providers and float32 on the CPU one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pie_core.backend_kit import BackendOptions

__all__ = ["TrtConfig", "resolve_options", "PROVIDERS", "INSTALL_GPU", "MAX_BATCH_TOKENS"]

PROVIDERS = {
    "tensorrt": ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    "cuda": ("CUDAExecutionProvider", "CPUExecutionProvider"),
    "cpu": ("CPUExecutionProvider",),
}
INSTALL_GPU = "pip install 'pie-backend-tensorrt[gpu]'"
MAX_BATCH_TOKENS = 2048
_KNOWN = {"provider", "quant", "block_size", "threads", "trt_max_tokens", "trt_max_kv", "trt_max_requests"}


@dataclass(frozen=True, slots=True)
class TrtConfig:
    """How this backend runs one model."""

    provider: str
    """``"tensorrt"``, ``"cuda"`` or ``"cpu"``."""
    dtype: str
    """``"float32"`` or ``"float16"``: the graph, its weights and the KV cache."""
    quant: str
    block_size: int
    threads: int | None
    device_id: int
    trt_max_tokens: int
    trt_max_kv: int
    trt_max_requests: int
    weights_key: str

    @property
    def providers(self) -> tuple[str, ...]:
        return PROVIDERS[self.provider]


def _int(extra: dict[str, Any], key: str, default: int, low: int) -> int:
    try:
        value = int(extra.get(key, default))
    except (TypeError, ValueError):
        raise ValueError(f"backend option {key} must be an integer, got {extra[key]!r}") from None
    if value < low:
        raise ValueError(f"backend option {key} must be >= {low}, got {value}")
    return value


def _device_id(device: str, provider: str) -> int:
    if device in ("cpu", "auto", ""):
        return 0
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"unknown device {device!r}: the tensorrt backend takes 'cuda[:index]' (or 'cpu')")
    if provider == "cpu":
        raise ValueError(f"device {device!r} with provider=cpu: drop one of them")
    return int(index or 0)


def resolve_options(options: BackendOptions, max_requests: int) -> TrtConfig:
    """Check the engine's options (before any weight is read).

    Raises:
        ValueError: An option is unknown or out of range.
    """
    extra = dict(options.extra)
    unknown = sorted(set(extra) - _KNOWN)
    if unknown:
        raise ValueError(f"unknown tensorrt backend option(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    provider = str(extra.get("provider", "tensorrt"))
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    dtype = options.dtype
    if dtype == "auto":
        dtype = "float32" if provider == "cpu" else "float16"
    if dtype in ("fp32", "fp16"):
        dtype = {"fp32": "float32", "fp16": "float16"}[dtype]
    if dtype not in ("float32", "float16"):
        raise ValueError(f"the tensorrt backend computes in float32 or float16, not {options.dtype!r}")
    quant = str(extra.get("quant", "none"))
    if quant not in ("none", "int4"):
        raise ValueError(f"quant must be 'none' or 'int4', got {quant!r}")
    block = _int(extra, "block_size", 32, 16)
    if block not in (16, 32, 64, 128):
        raise ValueError(f"block_size must be 16, 32, 64 or 128, got {block}")
    threads = extra.get("threads")
    return TrtConfig(
        provider=provider,
        dtype=dtype,
        quant=quant,
        block_size=block,
        threads=None if threads is None else _int(extra, "threads", 1, 1),
        device_id=_device_id(options.device, provider),
        trt_max_tokens=_int(extra, "trt_max_tokens", MAX_BATCH_TOKENS, 1),
        trt_max_kv=_int(extra, "trt_max_kv", 4096, 1),
        trt_max_requests=_int(extra, "trt_max_requests", max_requests, 1),
        weights_key=options.weights_key,
    )
