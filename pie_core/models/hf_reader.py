"""Read a Hugging Face checkpoint folder into a :class:`ModelSpec` and canonical float32 weights.

A folder holds ``config.json``, one ``model.safetensors`` or shards listed by
``model.safetensors.index.json``, and usually ``tokenizer.json``. Weights are renamed to the
canonical (GGUF) names of :mod:`pie_core.models.spec`, converted to float32 (bf16 included),
and Gemma's ``1 + w`` norms are folded into ``w``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from pie_core.errors import InvalidInput, NotFound
from pie_core.models.hf_config import spec_from_hf_config
from pie_core.models.spec import ModelSpec

__all__ = ["read_hf_folder", "spec_from_hf_config", "iter_hf_weights", "canonical_name", "is_hf_folder", "LAYER_NAMES"]

# Prefixes under which transformers stores the decoder of the supported model classes.
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
# Tensors of multimodal wrappers that are not part of the text decoder.
_FOREIGN = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")

_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
LAYER_NAMES = {  # transformers' names in a decoder layer -> canonical (blk.{i}.) names
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
# Gemma 3's sandwich norms: its post_attention_layernorm follows attention; the MLP's input
# norm is pre_feedforward_layernorm.
_GEMMA_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_TOP_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}


def is_hf_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` and safetensors weights."""
    folder = Path(path)
    return folder.is_dir() and (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def canonical_name(hf_name: str, arch: str) -> str | None:
    """Map a transformers parameter name to its canonical (GGUF) name.

    Args:
        hf_name: Name in the safetensors file, e.g. ``model.layers.3.self_attn.q_proj.weight``.
        arch: Architecture from the spec (decides Gemma 3's norm names).

    Returns:
        The canonical name, or ``None`` for tensors that are not part of the text decoder
        (vision towers, rotary caches).

    Raises:
        InvalidInput: A decoder tensor with a name this reader does not know.
    """
    if hf_name.startswith(_FOREIGN) or hf_name.endswith("rotary_emb.inv_freq"):
        return None
    if hf_name in ("lm_head.weight", "language_model.lm_head.weight"):
        return "output.weight"
    name = hf_name
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _LAYER.fullmatch(name)
    table = _GEMMA_LAYER_NAMES if arch == "gemma3" else LAYER_NAMES
    if match and match.group(2) in table:
        return f"blk.{match.group(1)}.{table[match.group(2)]}"
    raise InvalidInput(f"unexpected tensor {hf_name!r} in a {arch} checkpoint")


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / f for f in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise NotFound(f"no *.safetensors files in {folder}")
    return files


def _header(file: Path) -> dict[str, Any]:
    with file.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(size))
    header.pop("__metadata__", None)
    header["__data_start__"] = 8 + size
    return header


def _read_bf16(file: Path, entry: dict[str, Any], data_start: int) -> np.ndarray:
    # numpy has no bfloat16: the top 16 bits of a float32 are exactly a bf16.
    begin, end = entry["data_offsets"]
    raw = np.memmap(file, dtype="<u2", mode="r", offset=data_start + begin, shape=((end - begin) // 2,))
    out = (raw.astype(np.uint32) << 16).view(np.float32)
    return out.reshape(entry["shape"])


def iter_hf_weights(path: str | Path, spec: ModelSpec) -> Iterator[tuple[str, np.ndarray]]:
    """Yield the folder's decoder weights as ``(canonical_name, float32 array)`` pairs.

    Args:
        path: The Hugging Face folder.
        spec: Its spec (from :func:`read_hf_folder`); decides the Gemma norm fold and whether
            ``output.weight`` is dropped for tied embeddings.

    Yields:
        Canonical name and a C-contiguous float32 array, ``[out, in]`` for matrices.
    """
    folder = Path(path)
    gemma = spec.arch == "gemma3"
    for file in _shard_files(folder):
        header = _header(file)
        with safe_open(str(file), framework="np") as reader:
            for hf_name in reader.keys():
                name = canonical_name(hf_name, spec.arch)
                if name is None or (name == "output.weight" and spec.tie_embeddings):
                    continue
                entry = header[hf_name]
                if entry["dtype"] == "BF16":
                    array = _read_bf16(file, entry, header["__data_start__"])
                else:
                    array = reader.get_tensor(hf_name)
                array = np.ascontiguousarray(array, dtype=np.float32)
                if gemma and name.endswith("norm.weight"):
                    array = array + np.float32(1.0)
                yield name, array


def read_hf_folder(path: str | Path) -> tuple[ModelSpec, Iterator[tuple[str, np.ndarray]]]:
    """Read a Hugging Face checkpoint folder.

    Args:
        path: Folder with ``config.json`` and ``*.safetensors`` (sharded or not).

    Returns:
        The spec and a lazy iterator over canonical float32 weights (see
        :func:`iter_hf_weights`). A checkpoint without ``lm_head.weight`` is treated as tied.

    Raises:
        NotFound: The folder, its ``config.json`` or its safetensors files are missing.
        Unsupported: The architecture or one of its options is not supported.
    """
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise NotFound(f"{folder} is not a Hugging Face model folder: no config.json")
    spec = spec_from_hf_config(json.loads(config_file.read_text()))
    names = {n for f in _shard_files(folder) for n in _header(f) if not n.startswith("__")}
    has_head = any(canonical_name(n, spec.arch) == "output.weight" for n in names)
    if not has_head and not spec.tie_embeddings:
        spec = dataclasses.replace(spec, tie_embeddings=True)
    return spec, iter_hf_weights(folder, spec)
