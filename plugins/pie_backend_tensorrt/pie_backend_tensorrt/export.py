"""Export the model's graph once per weights, dtype and quantisation, and keep it on disk.

An export lives in ``<pie cache>/onnx/<weights key>-g<graph version>-<dtype>-<quant>/`` as
``model.onnx`` with its weights in ``model.onnx.data`` (ONNX protobufs stop at 2 GiB). It is
written to a temporary folder and renamed into place once whole. Weights the engine cannot name
(``weights_key`` empty) are not kept: small graphs stay in memory, large ones live in a temporary
folder until the session has read them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import onnx

from pie_core.backend_kit import ModelSpec, weights_cache_dir

from pie_backend_tensorrt.graph import GRAPH_VERSION, build_graph
from pie_backend_tensorrt.options import TrtConfig

__all__ = ["GraphSource", "exported_graph", "export_dir"]

GraphSource = bytes | Path
"""A serialised model (small graphs) or the path of a ``model.onnx``."""
_IN_MEMORY_BYTES = 1 << 30
"""Unnamed graphs up to this size are handed over in memory (protobufs stop at 2 GiB)."""


def export_dir() -> Path:
    """Where exports (and TensorRT engines, under ``trt/``) are kept."""
    return weights_cache_dir() / "onnx"


def _name(config: TrtConfig) -> str:
    quant = "none" if config.quant == "none" else f"{config.quant}b{config.block_size}"
    key = hashlib.sha256(config.weights_key.encode()).hexdigest()[:24]
    return f"{key}-g{GRAPH_VERSION}-{config.dtype}-{quant}"


def _quantize(model: onnx.ModelProto, block_size: int) -> onnx.ModelProto:
    """Every constant-weight MatMul as ``MatMulNBits`` (4-bit, symmetric blocks), by ONNX
    Runtime's own quantizer; accuracy level 4 lets the CPU kernels use int8 activations."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, block_size=block_size, is_symmetric=True, accuracy_level=4)
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)  # it logs a line per MatMul it leaves alone
    try:
        quantizer.process()
    finally:
        log.setLevel(level)
    return quantizer.model.model


def _build(spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], config: TrtConfig) -> onnx.ModelProto:
    model = build_graph(spec, weights, config.dtype)
    if config.quant == "int4":
        model = _quantize(model, config.block_size)
    return model


def _save(model: onnx.ModelProto, folder: Path) -> Path:
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    return folder / "model.onnx"


@contextmanager
def exported_graph(
    spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], config: TrtConfig
) -> Iterator[GraphSource]:
    """The model's graph, valid inside the ``with``: from the cache when exported before
    (``weights`` is then not read).

    Raises:
        ValueError: A weight is missing or misshapen.
    """
    if not config.weights_key:
        model = _build(spec, weights, config)
        if sum(len(t.raw_data) for t in model.graph.initializer) < _IN_MEMORY_BYTES:
            yield model.SerializeToString()
            return
        with tempfile.TemporaryDirectory(prefix="pie-onnx-") as tmp:
            path = _save(model, Path(tmp))
            del model
            yield path
        return
    final = export_dir() / _name(config)
    path = final / "model.onnx"
    if not path.exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        model = _build(spec, weights, config)
        tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=final.parent))
        try:
            _save(model, tmp)
            del model
            try:
                os.rename(tmp, final)
            except OSError:  # another process exported it meanwhile
                if not path.exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    yield path
