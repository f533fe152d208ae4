"""What the engine asked for (``BackendOptions``), resolved into what this backend will run.

Keys of ``BackendOptions.extra`` the torch backend reads (all optional):

- ``quant``: ``"none"``, ``"int8"``, ``"int4"``, ``"w8a8"``, ``"q4"``, ``"q8"`` or ``"fit"``:
  quantisation of the linear layers (CPU). ``"auto"`` (the default), when ``dtype`` is ``"auto"``
  on a CPU, means fit where the backend's own kernels build (:mod:`pie_backend_torch.native`), else
  int4 where the CPU has native bf16 and w8a8 where it has not (see docs/performance.md for their
  speed and accuracy); else none. ``"fit"`` keeps every tensor as precise as the checkpoint gave
  it: q4 for tensors of a 4-bit GGUF type (each block of 32 on 16 levels), q5 for Q5_0 ones (5-bit,
  in the GGUF's own 0.69 bytes a weight; :mod:`pie_backend_torch.q5`), q8 for 6- and 8-bit ones,
  float32 for the rest; the Q/K/V and MLP-down projections take their int8 activations in two
  steps (about 15 bits: their inputs carry outlier channels), with one layer for every batch size, float32 activations and KV cache
  (``dtype`` auto), so that a row's result never depends on the other rows of its batch. ``"q8"``
  is int8 weights (blocks of 32, a float16 scale per 16 inputs) times int8 activations per 16
  inputs, on ``csrc/q4.cpp``. ``"q4"`` is 4-bit weights (blocks of 32, float16 scale and minimum) times
  int8 activations quantised per block of 32, on ``csrc/q4.cpp``; float32 activations.
  ``"w8a8"`` is int8 weights times int8 activations quantised per token on every call (outlier
  channels in float32), multiplied by ``torch._int_mm`` on a CPU with VNNI and by fbgemm's
  kernels on others; it takes any ``dtype``, the weight-only kinds need bfloat16.
- ``quant_max_tokens``: batches with more input tokens than this run the ``quant_large`` layers
  instead (the int8/int4 weight-only kernels are made for matrix-vector work). Default 8, and 64
  for q4 on a CPU with VNNI (decode batches of up to 64 requests stay on q4, prefill goes to w8a8). ``0`` keeps the
  ``quant`` layers for every batch, as does ``quant_large`` equal to ``quant``.
- ``quant_large``: ``"none"`` (dense weights in ``dtype``) or ``"w8a8"``: the layers of batches
  over ``quant_max_tokens``. ``"auto"`` (the default) is w8a8 when ``quant`` was left to auto,
  else none: on a CPU without AMX, bf16 GEMMs are 5-7x slower than int8 ones.
- ``kernels``: ``"torch"`` (plain torch ops) or ``"triton"`` (the Triton kernels of
  :mod:`pie_backend_torch.triton_kernels`); default triton on CUDA, torch on CPU. Triton on a CPU
  needs ``TRITON_INTERPRET=1`` (slow; for tests).
- ``cuda_graphs``: capture decode steps in CUDA graphs (default true on CUDA with the Triton
  kernels; ignored on a CPU).
- ``weights_cache``: keep the weights this backend derives (bf16 copies, int4/int8 packs) in
  ``<pie cache>/torch/`` and load them from there next time (default true; CPU only, and only
  when the engine names the weights with ``BackendOptions.weights_key`` and something is derived:
  plain float32 weights are the engine's own cache already).
- ``threads``: intra-op threads for CPU work (``torch.set_num_threads``, process-wide; default:
  torch's own choice).
- ``tp``: tensor-parallel ranks, an integer >= 1 (default 1: one process, nothing else changes).
  On a CPU each rank runs ``cores / tp`` intra-op threads unless ``threads`` is given (set
  process-wide, in rank 0's process too).
  ``tp=N`` starts N - 1 worker processes that hold a slice of every layer (Q/K/V, gate/up split
  by output, attention-out and MLP-down by input, KV heads per rank; see
  :mod:`pie_backend_torch.tp_shard`), joined by gloo on a CPU and NCCL on CUDA. The heads must
  split evenly: ``num_heads % tp == 0``, and ``num_kv_heads % tp == 0`` or ``tp % num_kv_heads ==
  0`` (then ranks share a KV head, each keeping its own copy). Under ``tp > 1`` ``quant`` auto
  means dense weights (``"none"``) and ``dtype`` auto bfloat16 where computed natively else
  float32; a format named explicitly is built by each rank over its slices: the block formats
  (q4, q8, fit, int4, int8) then hold exactly the one-rank layers' blocks when each rank's share
  of the attention-out and MLP-down inputs is a multiple of 32 (else those layers fall back as
  :func:`~pie_backend_torch.linear.quantise` says), while w8a8 scales each token over the rank's
  slice, a small numeric difference. CUDA graphs are off, and ``tp_timeout`` (seconds, default
  120) bounds every wait on another rank during a step; a load may wait longer
  (:data:`pie_backend_torch.tp_group.LOAD_TIMEOUT`: a worker starts Python and receives its weights).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from pie_core.backend_kit import BackendOptions

__all__ = ["TorchConfig", "resolve_options", "DTYPES", "QUANT_KINDS", "LARGE_KINDS"]

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
QUANT_KINDS = ("none", "int8", "int4", "w8a8", "q4", "q8", "fit")
LARGE_KINDS = ("none", "w8a8")
DEFAULT_QUANT_MAX_TOKENS = 8
Q4_MAX_TOKENS = 64
"""q4's default ``quant_max_tokens`` on a CPU with VNNI: its kernel keeps pace with w8a8's int8
GEMM up to ~64 rows with the weights in cache and reads 0.6 bytes a weight to w8a8's 1 when they
are not (a 32-request decode step of the default model: 90 ms on q4, 122 ms on w8a8); above that,
w8a8 is faster. The plain AVX2 path keeps the general default (not measured on an AVX2-only CPU)."""
_KNOWN_EXTRA = {
    "quant", "quant_large", "quant_max_tokens", "kernels", "cuda_graphs", "threads", "weights_cache", "tp", "tp_timeout"
}


@dataclass(frozen=True, slots=True)
class TorchConfig:
    """How this backend runs one model."""

    device: torch.device
    dtype: torch.dtype
    """Dense weights, activations and the KV cache."""
    quant: str
    quant_max_tokens: int
    quant_large: str
    kernels: str
    cuda_graphs: bool
    threads: int | None
    weights_key: str
    """The engine's name for the weights' content, or "" (see ``BackendOptions.weights_key``)."""
    weights_cache: bool
    """Whether derived weights are kept on disk under ``weights_key``."""
    tp: int = 1
    """Tensor-parallel ranks (this process is rank 0)."""
    tp_timeout: float = 120.0
    """Seconds any wait on another rank may take before it fails."""

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: use 'cpu' or 'cuda[:index]'") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but this torch build sees no CUDA device; use 'cpu'")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the torch backend runs on 'cpu' or 'cuda', not {name!r}")
    return device


def cpu_has_bf16() -> bool:
    """Whether oneDNN computes bf16 natively on this CPU (AVX512-BF16, AMX); it also pre-packs bf16 weights only there."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _auto_quant(dtype_name: str, device: torch.device, dtype: torch.dtype) -> str:
    """``quant="auto"``: fit where the backend's kernels build; else int4 weight-only decode where
    the CPU computes bf16 natively, w8a8 on other CPUs (AVX2: fbgemm's int8 kernels are 2x int4's
    speed there, and bf16 is emulated); none when the dtype was chosen by hand or on a GPU."""
    if dtype_name != "auto" or device.type != "cpu":
        return "none"
    from pie_backend_torch import native

    if native.ops() is not None:
        return "fit"
    return "int4" if dtype == torch.bfloat16 else "w8a8"


def _q4_max_tokens() -> int:
    from pie_backend_torch import native

    return DEFAULT_QUANT_MAX_TOKENS if native.require_q4().isa() == "avx2" else Q4_MAX_TOKENS


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; expected 'auto' or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _flag(extra: dict[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if isinstance(value, str):
        if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"extra[{key!r}] must be a boolean, got {value!r}")
        return value.lower() in ("1", "true", "yes")
    return bool(value)


def _positive_int(extra: dict[str, Any], key: str, default: int) -> int:
    value = extra.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"extra[{key!r}] must be an integer >= 1, got {value!r}") from None
    if number < 1 or isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"extra[{key!r}] must be an integer >= 1, got {value!r}")
    return number


def _tp_checked(tp: int, extra: dict[str, Any]) -> None:
    """What ``tp > 1`` cannot run: CUDA graphs."""
    if tp == 1:
        return
    if _flag(extra, "cuda_graphs", False):
        raise ValueError(f"tp={tp} does not capture CUDA graphs (the all-reduces are not captured); drop cuda_graphs")


def resolve_options(options: BackendOptions) -> TorchConfig:
    """Check the engine's options and pick defaults for what it left open.

    Raises:
        ValueError: An option is unknown, out of range, or not available on this machine.
    """
    extra = dict(options.extra)
    unknown = sorted(set(extra) - _KNOWN_EXTRA)
    if unknown:
        raise ValueError(f"unknown torch backend option(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN_EXTRA))}")
    device = _device(options.device)
    dtype = _dtype(options.dtype, device)
    tp = _positive_int(extra, "tp", 1)
    _tp_checked(tp, extra)
    try:
        tp_timeout = float(extra.get("tp_timeout", 120.0))
    except (TypeError, ValueError):
        tp_timeout = float("nan")
    if not tp_timeout > 0:
        raise ValueError(f"extra['tp_timeout'] must be > 0 seconds, got {extra.get('tp_timeout')!r}")
    if tp > 1:
        extra.setdefault("quant", "none")  # auto: dense; a format asked for by name is split as it is
        extra["quant"] = "none" if extra["quant"] == "auto" else extra["quant"]
        extra["cuda_graphs"] = False
    quant = str(extra.get("quant", "auto"))
    auto_quant = quant == "auto"
    if auto_quant:
        quant = _auto_quant(options.dtype, device, dtype)
    if quant not in QUANT_KINDS:
        raise ValueError(f"unsupported quant {quant!r}; expected one of {', '.join(QUANT_KINDS)} or 'auto'")
    if quant == "fit" and options.dtype == "auto":
        dtype = torch.float32  # activations and KV cache as transformers' float32 reference
    if quant in ("w8a8", "q4", "q8", "fit") and device.type != "cpu":
        raise ValueError(f"{quant} runs on the CPU; use device='cpu' (got {device})")
    if quant in ("q4", "q8", "fit"):
        from pie_backend_torch import native

        native.require_q4()
    if quant in ("int8", "int4") and (device.type != "cpu" or dtype != torch.bfloat16):
        raise ValueError(
            f"weight-only {quant} runs on the CPU with bfloat16 activations; "
            f"use device='cpu' and dtype='bfloat16' (got {device}, {dtype})"
        )
    quant_large = str(extra.get("quant_large", "auto"))
    if quant_large == "auto":
        quant_large = "w8a8" if auto_quant and quant != "none" else "none"
    if quant_large not in LARGE_KINDS:
        raise ValueError(f"unsupported quant_large {quant_large!r}; expected one of {', '.join(LARGE_KINDS)} or 'auto'")
    if quant_large != "none" and quant == "none":
        raise ValueError("quant_large applies to batches over quant_max_tokens when quant is not 'none'; set quant too")
    quant_max = int(extra.get("quant_max_tokens", _q4_max_tokens() if quant == "q4" else DEFAULT_QUANT_MAX_TOKENS))
    if quant_max < 0:
        raise ValueError(f"quant_max_tokens must be >= 0, got {quant_max}")
    if quant == "fit":
        if extra.get("quant_large", "auto") not in ("auto", "none") or int(extra.get("quant_max_tokens", 0)) != 0:
            raise ValueError("quant 'fit' runs one layer for every batch size; leave quant_max_tokens and quant_large unset")
        quant_max, quant_large = 0, "none"
    kernels = str(extra.get("kernels", "triton" if device.type == "cuda" else "torch"))
    if kernels not in ("torch", "triton"):
        raise ValueError(f"kernels must be 'torch' or 'triton', got {kernels!r}")
    if kernels == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the Triton kernels need a CUDA device; on a CPU set TRITON_INTERPRET=1 (slow, for tests)")
    graphs = _flag(extra, "cuda_graphs", device.type == "cuda" and kernels == "triton") and device.type == "cuda"
    if graphs and kernels != "triton":
        raise ValueError("cuda_graphs capture the Triton kernels; use kernels='triton' or cuda_graphs=False")
    threads = extra.get("threads")
    if threads is not None and int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return TorchConfig(
        device=device,
        dtype=dtype,
        quant=quant,
        quant_max_tokens=quant_max,
        quant_large=quant_large,
        kernels=kernels,
        cuda_graphs=graphs,
        threads=None if threads is None else int(threads),
        weights_key=options.weights_key,
        weights_cache=_flag(extra, "weights_cache", True)
        and tp == 1  # a rank's slice is not what the store keeps
        and bool(options.weights_key)
        and device.type == "cpu"
        and (quant != "none" or dtype != torch.float32),
        tp=tp,
        tp_timeout=tp_timeout,
    )
