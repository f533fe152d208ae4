"""GGUF tensor data → float32, in large chunks that parallelise across threads.

The arithmetic is ``gguf.quants``' own (its per-type ``dequantize_blocks``); only the chunking
differs: ``gguf.quants.dequantize`` works 16 rows at a time and concatenates, which costs ~10x
in Python overhead on a 150k-row embedding. Chunks of ~256k values keep numpy in long
vectorised loops that release the GIL, so two threads give close to two cores.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

__all__ = ["dequantize_into", "chunk_jobs", "CHUNK_VALUES"]

CHUNK_VALUES = 1 << 18  # float32 values per job (1 MiB out)


def _blocks_fn(qtype: GGMLQuantizationType) -> Callable[[np.ndarray], np.ndarray] | None:
    cls = getattr(quants, qtype.name, None)
    if cls is None or not hasattr(cls, "dequantize_blocks"):
        return None
    init = getattr(cls, "init_grid", None)
    if init is not None:
        init()  # i-quants build a lookup grid once
    fn: Callable[[np.ndarray], np.ndarray] = cls.dequantize_blocks
    return fn


def dequantize_into(raw: np.ndarray, qtype: GGMLQuantizationType, out: np.ndarray, start: int, stop: int) -> None:
    """Dequantise blocks ``start:stop`` of ``raw`` into the matching slice of ``out``.

    Args:
        raw: The tensor's stored bytes (uint8, flat).
        qtype: Its storage type.
        out: Flat float32 array of the tensor's element count.
        start: First block (for F32/F16/BF16 a block is one element).
        stop: One past the last block.

    Raises:
        NotImplementedError: ``gguf`` cannot dequantise ``qtype``.
    """
    block, type_size = GGML_QUANT_SIZES[qtype]
    part = raw[start * type_size : stop * type_size]
    dst = out[start * block : stop * block]
    if qtype == GGMLQuantizationType.F32:
        dst[:] = part.view("<f4")
    elif qtype == GGMLQuantizationType.F16:
        dst[:] = part.view("<f2")
    elif qtype == GGMLQuantizationType.BF16:
        dst.view(np.uint32)[:] = part.view("<u2").astype(np.uint32) << 16
    else:
        fn = _blocks_fn(qtype)
        if fn is None:
            raise NotImplementedError(f"gguf cannot dequantise {qtype.name}")
        dst.reshape(-1, block)[:] = fn(part.reshape(-1, type_size))


def chunk_jobs(qtype: GGMLQuantizationType, n_values: int) -> list[tuple[int, int]]:
    """Split a tensor of ``n_values`` elements into ``(start_block, stop_block)`` jobs."""
    block = GGML_QUANT_SIZES[qtype][0]
    n_blocks = n_values // block
    step = max(1, CHUNK_VALUES // block)
    return [(i, min(i + step, n_blocks)) for i in range(0, n_blocks, step)]
