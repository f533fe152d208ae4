"""Execution providers: what this ONNX Runtime offers, the options each gets, and the honest errors.

The TensorRT-only surface is kept to this file: provider options and the shape profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pie_backend_tensorrt.graph import GROUPS
from pie_backend_tensorrt.options import INSTALL_GPU, TrtConfig

__all__ = ["ProviderMissing", "available", "check_available", "provider_options", "check_session", "VERIFIED"]

VERIFIED = {
    "CPUExecutionProvider": "verified in CI (conformance and greedy tokens equal to transformers)",
    "CUDAExecutionProvider": "not yet verified on a GPU",
    "TensorrtExecutionProvider": "never verified: no machine of this project has TensorRT",
}
"""Where each provider was seen working; shown by ``pie backends``."""


class ProviderMissing(ValueError):
    """A provider was asked for that this installation of ONNX Runtime cannot give."""


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ProviderMissing(
            "the tensorrt backend needs ONNX Runtime: "
            f"{INSTALL_GPU} (onnxruntime-gpu and tensorrt, for an NVIDIA GPU) or "
            "pip install 'pie-backend-tensorrt[cpu]' (onnxruntime, to run the graph on the CPU)"
        ) from None
    return onnxruntime


def available() -> list[str]:
    """Providers of the installed ONNX Runtime (empty when none is installed)."""
    try:
        return list(_ort().get_available_providers())
    except ProviderMissing:
        return []


def check_available(config: TrtConfig) -> None:
    """Refuse at once a provider this machine does not have.

    Raises:
        ProviderMissing: Naming what to install, and ``provider=cpu`` as the way to run the same
            graph on the CPU.
    """
    have = _ort().get_available_providers()
    wanted = config.providers[0]
    if wanted in have:
        return
    what = "TensorRT" if config.provider == "tensorrt" else "CUDA"
    raise ProviderMissing(
        f"--backend tensorrt needs {what} (ONNX Runtime's {wanted}), and this machine's ONNX Runtime "
        f"offers only {', '.join(have)}: on an NVIDIA GPU, {INSTALL_GPU}; to run the same graph on the CPU, "
        "pass --backend-option provider=cpu"
    )


def _profile(config: TrtConfig, sliding: bool, cache_slots: int, kv_heads: int, head_dim: int,
             num_layers: int, which: str) -> str:
    """A TensorRT shape profile (``name:dims,...``) for the graph's dynamic inputs."""
    n = {"min": 1, "opt": min(64, config.trt_max_tokens), "max": config.trt_max_tokens}[which]
    r = {"min": 1, "opt": min(16, config.trt_max_requests), "max": config.trt_max_requests}[which]
    t = {"min": 1, "opt": min(1024, config.trt_max_kv), "max": config.trt_max_kv}[which]
    half = head_dim // 2
    dims = {"input_ids": [n], "write_slots": [n, 1], "out_index": [n], "cos": [n, half], "sin": [n, half],
            "logit_index": [n], "hidden_index": [n]}
    if sliding:
        dims.update(cos_local=[n, half], sin_local=[n, half])
    for g in GROUPS:
        m = 1 if g == "a" else n
        dims.update({f"q_index_{g}": [r, m], f"kv_slots_{g}": [r, t], f"bias_{g}": [r, m, t],
                     f"row_valid_{g}": [r, m, 1]})
        if sliding:
            dims.update({f"bias_local_{g}": [r, m, t], f"row_valid_local_{g}": [r, m, 1]})
    for layer in range(num_layers):
        for kind in ("k", "v"):
            dims[f"{kind}_cache.{layer}"] = [cache_slots, kv_heads, head_dim]
    return ",".join(f"{name}:{'x'.join(str(d) for d in shape)}" for name, shape in dims.items())


def provider_options(config: TrtConfig, cache_dir: Path, *, sliding: bool, cache_slots: int, kv_heads: int,
                     head_dim: int, num_layers: int) -> list[dict[str, Any]]:
    """Options of each provider in ``config.providers``, in order."""
    out: list[dict[str, Any]] = []
    for name in config.providers:
        if name == "TensorrtExecutionProvider":
            shape = dict(sliding=sliding, cache_slots=cache_slots, kv_heads=kv_heads, head_dim=head_dim,
                         num_layers=num_layers)
            out.append({
                "device_id": config.device_id,
                "trt_fp16_enable": config.dtype == "float16",
                "trt_engine_cache_enable": True,
                "trt_engine_cache_path": str(cache_dir / "trt"),
                "trt_timing_cache_enable": True,
                "trt_timing_cache_path": str(cache_dir / "trt"),
                "trt_profile_min_shapes": _profile(config, which="min", **shape),
                "trt_profile_opt_shapes": _profile(config, which="opt", **shape),
                "trt_profile_max_shapes": _profile(config, which="max", **shape),
            })
        elif name == "CUDAExecutionProvider":
            out.append({"device_id": config.device_id})
        else:
            out.append({})
    return out


def check_session(session: Any, config: TrtConfig) -> None:
    """Refuse a session where ONNX Runtime quietly dropped the provider asked for (e.g. TensorRT's
    libraries missing: ONNX Runtime then warns and runs the CUDA provider instead).

    Raises:
        ProviderMissing: The first provider asked for is not among the session's.
    """
    if config.providers[0] not in session.get_providers():
        raise ProviderMissing(
            f"ONNX Runtime could not start {config.providers[0]} (the session runs {', '.join(session.get_providers())}); "
            f"check the GPU libraries ({INSTALL_GPU}), or pass --backend-option provider=cpu"
        )
