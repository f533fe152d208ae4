"""Derived weights on disk: what :func:`build_weights` made once is loaded from a file next time.

Building the CPU layout reads the engine's float32 weights (2 GB for the default model) and
quantises every linear layer to int4, which takes seconds; the result (bf16 copies, int4/int8
packs, norms) is one safetensors file of about half that size, keyed by the engine's
``weights_key`` and everything the layout depends on (dtype, quantisation, whether dense copies
are kept, torch's version: the int4 packing is torch's own). A file that cannot be read or does
not match the model is ignored (and rewritten); a failed write only costs the next load time.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pie_core.backend_kit import ModelSpec, weights_cache_dir

from pie_backend_torch.linear import INT4_GROUP
from pie_backend_torch.options import TorchConfig
from pie_backend_torch.weights import ModelWeights, build_weights, rebuild_weights

__all__ = ["load_weights", "store_path"]

_ALIGN = 64
_LAYOUT = 7
"""Bump when the recorded names or tensor layouts change."""


def store_path(config: TorchConfig) -> Path:
    """The file holding the derived weights for ``config`` (which names them by ``weights_key``)."""
    large = config.quant_large if config.quant_max_tokens > 0 else "nolarge"
    variant = f"{config.dtype_name}-{config.quant}-{large}-g{INT4_GROUP}-torch{torch.__version__}-v{_LAYOUT}"
    return weights_cache_dir() / "torch" / f"{config.weights_key}-{variant}.safetensors"


def _fingerprint(spec: ModelSpec) -> dict[str, str]:
    return {
        "arch": spec.arch,
        "layers": str(spec.num_layers),
        "hidden": str(spec.hidden_size),
        "vocab": str(spec.vocab_size),
        "intermediate": str(spec.intermediate_size),
    }


def load_weights(spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], config: TorchConfig) -> ModelWeights:
    """The model's weights, from the store when ``config.weights_cache`` and a matching file exist.

    ``weights`` is consumed only when the weights are built (a store miss).

    Raises:
        ValueError: A weight is missing, misshapen, or not expected by ``spec``.
    """
    if not config.weights_cache:
        return build_weights(spec, weights, config)
    path = store_path(config)
    cached = _read(path, spec, config)
    if cached is not None:
        return cached
    record: dict[str, torch.Tensor] = {}
    built = build_weights(spec, weights, config, record)
    _write(path, record, spec)
    return built


def _read(path: Path, spec: ModelSpec, config: TorchConfig) -> ModelWeights | None:
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if {k: meta.get(k) for k in _fingerprint(spec)} != _fingerprint(spec):
                raise ValueError(f"it holds another model ({meta})")
            tensors = {k: _aligned(f.get_tensor(k)) for k in f.keys()}
        return rebuild_weights(spec, tensors, config)
    except Exception as exc:  # a torn or foreign file: rebuild, and rewrite it
        warnings.warn(f"ignoring the torch weights cache {path}: {exc}", RuntimeWarning, stacklevel=3)
        return None


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in storage of its own: safetensors places tensors at any byte offset, and torch's
    int8/int4 CPU kernels crash on unaligned weights."""
    return t if t.data_ptr() % _ALIGN == 0 else t.clone()


def _write(path: Path, record: dict[str, torch.Tensor], spec: ModelSpec) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in record.items()}, str(tmp), metadata=_fingerprint(spec))
        os.replace(tmp, path)
    except (OSError, RuntimeError, ValueError) as exc:
        tmp.unlink(missing_ok=True)
        warnings.warn(f"torch weights cache not written to {path}: {exc}", RuntimeWarning, stacklevel=3)
