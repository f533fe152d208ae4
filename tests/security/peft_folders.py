"""PEFT adapter folders with random weights for the dummy model, written as an operator would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pie_core.adapters import peft
from pie_core.backend_kit.lora import target_shape, tensor_name


def write_random_peft(folder: Path, engine: Any, *, rank: int, seed: int, targets: tuple[str, ...] = ("attn_q",)) -> None:
    """A PEFT LoRA folder at ``folder`` (parents made) for the engine's first model."""
    spec = next(iter(engine.models.values())).spec
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for target in targets:
            out, inp = target_shape(spec, target)
            tensors[tensor_name(layer, target, "a")] = rng.standard_normal((rank, inp), dtype=np.float32)
            tensors[tensor_name(layer, target, "b")] = rng.standard_normal((out, rank), dtype=np.float32)
    folder.mkdir(parents=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        peft.write(fd, peft.PeftAdapter(tensors, rank, float(rank)), "dummy")
    finally:
        os.close(fd)
