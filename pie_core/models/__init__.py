"""Checkpoint reading: GGUF and Hugging Face folders → ModelSpec + canonical weights,
tokenizers, chat formats, and the model registry.

Names are imported lazily, so ``from pie_core.models.spec import ModelSpec`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ModelSpec",
    "RopeConfig",
    "ARCHITECTURES",
    "read_hf_folder",
    "spec_from_hf_config",
    "read_gguf",
    "GGUFCheckpoint",
    "Tokenizer",
    "ChatFormat",
    "ChatBuilder",
    "chat_format_for",
    "ModelSource",
    "resolve_model",
    "list_models",
    "model_info",
    "WeightsCache",
    "ensure_gguf",
    "DEFAULT_MODEL",
]

_HOME = {
    "ModelSpec": "spec",
    "RopeConfig": "spec",
    "ARCHITECTURES": "spec",
    "read_hf_folder": "hf_reader",
    "spec_from_hf_config": "hf_config",
    "read_gguf": "gguf_reader",
    "GGUFCheckpoint": "gguf_reader",
    "Tokenizer": "tokenizer",
    "ChatFormat": "chat_formats",
    "ChatBuilder": "chat_formats",
    "chat_format_for": "chat_formats",
    "ModelSource": "registry",
    "resolve_model": "registry",
    "list_models": "registry",
    "model_info": "registry",
    "WeightsCache": "weights_cache",
    "ensure_gguf": "default_model",
    "DEFAULT_MODEL": "default_model",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'pie_core.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pie_core.models.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
