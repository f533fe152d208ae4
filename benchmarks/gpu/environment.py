"""Phase ``environment``: what the machine has — versions, the device, its memory bandwidth, ONNX
Runtime's providers, the backends Pie finds — so that every later number can be read against it.

The bandwidth that the HBM floor uses comes from the device's name (:data:`HBM_BANDWIDTH`, the
datasheet figure), else from a device-to-device copy measured here (bytes read plus written).
"""

from __future__ import annotations

import importlib.metadata
import platform
import time

from benchmarks.gpu.record import Record
from benchmarks.gpu.settings import Settings

__all__ = ["run", "HBM_BANDWIDTH", "datasheet_bandwidth"]

HBM_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM (the "H100 80GB HBM3" of this workplace)
    ("A100-SXM4-80GB", 2.039e12),
    ("A100", 1.555e12),
)
"""Device-name fragment -> memory bandwidth in bytes/s (datasheet), first match wins."""

_PACKAGES = ("torch", "triton", "transformers", "numpy", "tokenizers", "safetensors", "onnxruntime",
             "onnxruntime-gpu", "onnx", "peft", "pytest", "gguf", "tomlkit", "pie-engine", "pie-backend-torch")


def datasheet_bandwidth(name: str) -> float | None:
    """Bytes/s of the device called ``name`` (e.g. ``NVIDIA H100 80GB HBM3``), or None if unknown."""
    return next((bw for key, bw in HBM_BANDWIDTH if key.lower() in name.lower()), None)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _copy_bandwidth(torch, device: str, mib: int) -> float:
    """Bytes/s of a device copy (read + write), the best of five after a warm-up."""
    n = mib * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best


def run(settings: Settings, record: Record) -> None:
    record.put("python", platform.python_version())
    record.put("versions", {p: _version(p) for p in _PACKAGES})
    import torch

    record.put("torch_cuda", {"built_with": torch.version.cuda, "available": torch.cuda.is_available()})
    if settings.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but torch sees no CUDA device (torch.version.cuda = "
                               f"{torch.version.cuda}); run with --device cpu or on a GPU machine")
        props = torch.cuda.get_device_properties(0)
        record.put("device", {"name": props.name, "memory_gib": props.total_memory / (1 << 30),
                              "multiprocessors": props.multi_processor_count,
                              "capability": f"{props.major}.{props.minor}",
                              "bf16": torch.cuda.is_bf16_supported()})
        name = props.name
    else:
        name = platform.processor() or platform.machine()
        record.put("device", {"name": name, "threads": torch.get_num_threads()})
    measured = _copy_bandwidth(torch, settings.device, 64 if settings.tiny else 1024)
    datasheet = datasheet_bandwidth(name) if settings.device == "cuda" else None
    record.put("copy_bandwidth_tbps", measured / 1e12)
    record.put("hbm_bandwidth", {"bytes_per_s": datasheet or measured,
                                 "source": "datasheet" if datasheet else "measured device copy"})
    try:
        import onnxruntime

        record.put("onnxruntime_providers", onnxruntime.get_available_providers())
    except ImportError as exc:
        record.put("onnxruntime_providers", f"onnxruntime not importable: {exc}")
    backends = sorted(ep.name for ep in importlib.metadata.entry_points(group="pie.backends"))
    record.put("pie_backends", backends)
    plugin = [ep.name for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "pie_conformance"]
    record.check("Pie's backends and conformance plugin are found through entry points",
                 "torch" in backends and bool(plugin), f"pie.backends: {backends}; pytest11 pie_conformance: {bool(plugin)}")
    try:
        import triton

        record.put("triton", triton.__version__)
    except ImportError as exc:
        record.put("triton", f"not importable: {exc}")
