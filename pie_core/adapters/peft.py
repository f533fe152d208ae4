"""Adapters on disk in the Hugging Face PEFT layout: ``adapter_config.json`` plus
``adapter_model.safetensors``.

A folder PEFT saved for the same base model loads here, and a folder saved here loads into PEFT
(``PeftModel.from_pretrained``). Only plain LoRA on the projections of :data:`pie_core.backend_kit.lora.TARGETS`
is understood; anything else a config asks for (DoRA, biases, extra trained modules, per-module
ranks, transposed weights) is refused by name rather than silently dropped.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors

from pie_core.errors import InvalidInput
from pie_core.backend_kit.lora import TARGETS, tensor_name
from pie_core.models.hf_reader import LAYER_NAMES

__all__ = ["PeftAdapter", "read", "write", "CONFIG", "WEIGHTS", "MAX_FILE_BYTES"]

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
MAX_FILE_BYTES = 4 << 30
"""Largest weights file read (a config is read only up to 1 MiB)."""

_HF_TO_TARGET = {  # transformers' module name in a layer -> the adapter target of that projection
    hf[: -len(".weight")]: ours[: -len(".weight")]
    for hf, ours in LAYER_NAMES.items()
    if hf.endswith(".weight") and ours[: -len(".weight")] in TARGETS
}
_TARGET_TO_HF = {t: hf for hf, t in _HF_TO_TARGET.items()}
_KEY = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)\.lora_([AB])\.weight$")
_REFUSED = {
    "use_dora": "DoRA adapters",
    "fan_in_fan_out": "fan_in_fan_out (transposed) weights",
    "modules_to_save": "extra trained modules (modules_to_save)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
}


@dataclass(frozen=True, slots=True)
class PeftAdapter:
    """An adapter's tensors by :func:`pie_core.backend_kit.lora.tensor_name`, with its LoRA hyper-parameters."""

    tensors: dict[str, np.ndarray]
    rank: int
    alpha: float
    rslora: bool = False

    @property
    def scaling(self) -> float:
        """What multiplies ``B @ A``: ``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def read(folder: Path) -> PeftAdapter:
    """Read a PEFT LoRA folder.

    Raises:
        InvalidInput: A file is missing, too large or malformed, or the adapter uses a PEFT
            feature Pie does not run; the message names it.
    """
    config = _read_config(folder / CONFIG)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise InvalidInput(f"{folder} has no {WEIGHTS}")
    if weights.stat().st_size > MAX_FILE_BYTES:
        raise InvalidInput(f"{weights} is larger than {MAX_FILE_BYTES} bytes")
    try:
        entries = safetensors.deserialize(weights.read_bytes())
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise InvalidInput(f"{weights} is not a safetensors file: {exc}") from None
    tensors: dict[str, np.ndarray] = {}
    for key, entry in entries:
        match = _KEY.match(key)
        if match is None:
            raise InvalidInput(f"{weights} holds {key!r}; Pie runs LoRA on {', '.join(_HF_TO_TARGET)} only")
        layer, module, half = match.groups()
        tensors[tensor_name(int(layer), _HF_TO_TARGET[module], half.lower())] = _array(key, entry)
    if not tensors:
        raise InvalidInput(f"{weights} holds no LoRA weights")
    return PeftAdapter(tensors=tensors, rank=config["r"], alpha=config["lora_alpha"], rslora=config["use_rslora"])


def write(folder: Path, adapter: PeftAdapter, base_model: str) -> None:
    """Write ``adapter`` as a PEFT LoRA folder (created if missing; both files replaced)."""
    folder.mkdir(parents=True, exist_ok=True)
    targets = sorted({name.split(".")[2] for name in adapter.tensors})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": adapter.rank,
        "lora_alpha": adapter.alpha,
        "use_rslora": adapter.rslora,
        "target_modules": [_TARGET_TO_HF[t].split(".")[1] for t in targets],
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    arrays = {}
    for name, array in adapter.tensors.items():
        _, layer, target, half = name.split(".")
        key = f"base_model.model.model.layers.{layer}.{_TARGET_TO_HF[target]}.lora_{half[-1].upper()}.weight"
        arrays[key] = np.ascontiguousarray(array, dtype=np.float32)
    from safetensors.numpy import save_file

    save_file(arrays, str(folder / WEIGHTS))
    (folder / CONFIG).write_text(json.dumps(config, indent=2))


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise InvalidInput(f"{path.parent} has no {CONFIG}; a PEFT adapter folder holds {CONFIG} and {WEIGHTS}")
    if path.stat().st_size > 1 << 20:
        raise InvalidInput(f"{path} is larger than 1 MiB")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidInput(f"{path} must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidInput(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, what in _REFUSED.items():
        if config.get(key):
            raise InvalidInput(f"{path}: Pie does not run {what}")
    if config.get("bias", "none") != "none":
        raise InvalidInput(f"{path}: Pie does not run trained biases (bias={config['bias']!r})")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidInput(f"{path}: r must be a positive integer, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise InvalidInput(f"{path}: lora_alpha must be a number, got {alpha!r}")
    return {"r": rank, "lora_alpha": float(alpha), "use_rslora": bool(config.get("use_rslora", False))}


def _array(key: str, entry: dict) -> np.ndarray:
    dtype, shape, data = entry["dtype"], tuple(entry["shape"]), entry["data"]
    if len(shape) != 2:
        raise InvalidInput(f"{key} must be a matrix, got shape {shape}")
    if dtype == "F32":
        return np.frombuffer(data, dtype="<f4").reshape(shape).copy()
    if dtype == "F16":
        return np.frombuffer(data, dtype="<f2").reshape(shape).astype(np.float32)
    if dtype == "BF16":
        bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    raise InvalidInput(f"{key} has dtype {dtype}; expected F32, F16 or BF16")
