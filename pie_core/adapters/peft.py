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

import numpy as np
import safetensors

from pie_core.errors import InvalidInput
from pie_core.safepath import read_file, write_file
from pie_core.backend_kit.lora import TARGETS, tensor_name
from pie_core.models.hf_reader import LAYER_NAMES

__all__ = ["PeftAdapter", "read", "write", "unusable", "CONFIG", "WEIGHTS", "MAX_FILE_BYTES"]

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


def read(folder: int, shown: str, *, links: bool = False, max_weights: int = MAX_FILE_BYTES) -> PeftAdapter:
    """Read the PEFT LoRA folder open as descriptor ``folder`` (``shown`` names it in errors).

    Args:
        links: Follow links to the two files (``pie run``'s local folders, such as a Hugging
            Face cache snapshot); never for a user's folder (:mod:`pie_core.safepath`).
        max_weights: Largest weights file read.

    Raises:
        InvalidInput: :func:`unusable` when a file is missing, a link, not a regular file, too
            large, or not JSON / safetensors (one message: it never tells what exists); a
            message naming the feature when the adapter uses one Pie does not run.
    """
    try:
        config = _config(read_file(folder, CONFIG, 1 << 20, links=links), shown)
        entries = safetensors.deserialize(read_file(folder, WEIGHTS, max_weights, links=links))
    except InvalidInput:
        raise
    except Exception:  # OSError, a bad JSON or safetensors header: all read the same
        raise unusable(shown) from None
    tensors: dict[str, np.ndarray] = {}
    for key, entry in entries:
        match = _KEY.match(key)
        if match is None:
            raise InvalidInput(f"{shown}/{WEIGHTS} holds {key!r}; Pie runs LoRA on {', '.join(_HF_TO_TARGET)} only")
        layer, module, half = match.groups()
        tensors[tensor_name(int(layer), _HF_TO_TARGET[module], half.lower())] = _array(key, entry)
    if not tensors:
        raise InvalidInput(f"{shown}/{WEIGHTS} holds no LoRA weights")
    return PeftAdapter(tensors=tensors, rank=config["r"], alpha=config["lora_alpha"], rslora=config["use_rslora"])


def unusable(shown: str) -> InvalidInput:
    """The one refusal of a folder that cannot be read or written, whatever is or is not there."""
    return InvalidInput(f"{shown[:200]!r} is not a PEFT adapter folder Pie can use: it must be a folder (not a link) "
                        f"holding {CONFIG} (a JSON object) and {WEIGHTS} (safetensors), each a regular file")


def write(folder: int, adapter: PeftAdapter, base_model: str) -> None:
    """Write ``adapter`` as a PEFT LoRA folder into the folder descriptor ``folder`` (both
    files replaced through :func:`pie_core.safepath.write_file`).

    Raises:
        OSError: A file cannot be written (a folder holds its name).
    """
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
    from safetensors.numpy import save

    write_file(folder, WEIGHTS, save(arrays))
    write_file(folder, CONFIG, json.dumps(config, indent=2).encode())


def _config(raw: bytes, shown: str) -> dict:
    config = json.loads(raw.decode())
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    where = f"{shown}/{CONFIG}"
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidInput(f"{where}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, what in _REFUSED.items():
        if config.get(key):
            raise InvalidInput(f"{where}: Pie does not run {what}")
    if config.get("bias", "none") != "none":
        raise InvalidInput(f"{where}: Pie does not run trained biases (bias={config['bias']!r})")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidInput(f"{where}: r must be a positive integer, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise InvalidInput(f"{where}: lora_alpha must be a number, got {alpha!r}")
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
