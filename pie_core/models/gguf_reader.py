"""Read a GGUF checkpoint into a :class:`ModelSpec` and canonical float32 weights.

GGUF tensor names are already the canonical names of :mod:`pie_core.models.spec`; this module
dequantises them (in parallel, in file order), undoes llama.cpp's Q/K row permutation for the
``llama`` architecture, and drops tensors that are not weights (``rope_freqs.weight``, whose
content becomes the spec's llama 3 RoPE parameters).

Gemma 3 GGUFs store RMSNorm weights with Gemma's ``+1`` already added by llama.cpp's
converter (transformers subtracts 1 when it loads them), so they pass through unchanged.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pie_core.errors import InvalidInput
from pie_core.models.dequantize import chunk_jobs, dequantize_into
from pie_core.models.gguf_file import GGUFFile, GGUFTensorInfo
from pie_core.models.gguf_spec import spec_from_gguf
from pie_core.models.spec import ModelSpec

__all__ = ["GGUFCheckpoint", "read_gguf", "Progress", "Allocator", "unpermute_llama_rows"]

Progress = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``, called from the iterating thread after each tensor."""
Allocator = Callable[[str, tuple[int, ...]], np.ndarray]
"""``allocate(name, shape)`` → a C-contiguous float32 array to dequantise a tensor into."""

_CANONICAL = re.compile(
    r"token_embd\.weight|output\.weight|output_norm\.weight|blk\.\d+\.(?:attn_norm|attn_q|attn_k|attn_v|"
    r"attn_q_norm|attn_k_norm|attn_output|post_attention_norm|ffn_norm|ffn_gate|ffn_up|ffn_down|post_ffw_norm)"
    r"\.(?:weight|bias)"
)
_NOT_WEIGHTS = frozenset({"rope_freqs.weight"})
_LOOKAHEAD_BYTES = 256 << 20  # float32 output dequantised ahead of the consumer


def unpermute_llama_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K permutation (interleaved RoPE pairs → Hugging Face rotate-half rows).

    Args:
        w: ``[n_heads * head_dim, ...]`` weight or bias as stored in the GGUF.
        n_heads: Query heads for ``attn_q``, key/value heads for ``attn_k``.

    Returns:
        A new C-contiguous array of the same shape.
    """
    head_dim = w.shape[0] // n_heads
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape))


class GGUFCheckpoint:
    """An opened GGUF checkpoint.

    Attributes:
        path: The file.
        file: Its parsed container (metadata for the tokenizer and chat template).
        spec: The model's spec.
    """

    def __init__(self, path: str | Path) -> None:
        """Open and parse ``path`` (header only; tensor data is read lazily).

        Raises:
            InvalidInput: Not a GGUF file, or one with unexpected tensors.
            Unsupported: Architecture or options this engine cannot run.
        """
        self.path = Path(path)
        self.file = GGUFFile(self.path)
        unknown = [t.name for t in self.file.tensors if t.name not in _NOT_WEIGHTS and not _CANONICAL.fullmatch(t.name)]
        if unknown:
            raise InvalidInput(f"{self.path.name}: unexpected tensors {unknown[:5]} for {self.file.architecture}")
        rope_freqs = self.read_tensor("rope_freqs.weight") if self.file.has_tensor("rope_freqs.weight") else None
        self.spec: ModelSpec = spec_from_gguf(self.file, rope_freqs)

    @property
    def weight_infos(self) -> list[GGUFTensorInfo]:
        """Descriptors of the tensors :meth:`weights` yields, in file order."""
        return [t for t in self.file.tensors if t.name not in _NOT_WEIGHTS]

    def quant_types(self) -> dict[str, int]:
        """Storage type name → number of tensors stored that way."""
        return dict(collections.Counter(t.qtype.name for t in self.file.tensors))

    def read_tensor(self, name: str) -> np.ndarray:
        """Dequantise one tensor as stored (no llama un-permutation), in the calling thread."""
        info = self.file.tensor(name)
        out = np.empty(int(np.prod(info.shape)), dtype=np.float32)
        for start, stop in chunk_jobs(info.qtype, out.size):
            dequantize_into(self.file.raw(info), info.qtype, out, start, stop)
        return out.reshape(info.shape)

    def _finish(self, info: GGUFTensorInfo, out: np.ndarray) -> np.ndarray:
        array = out.reshape(info.shape)
        if self.spec.arch == "llama":
            heads = {".attn_q.": self.spec.num_heads, ".attn_k.": self.spec.num_kv_heads}
            for part, n in heads.items():
                if part in info.name:
                    array[...] = unpermute_llama_rows(array, n)  # in place: `out` may be a file
        return array

    def weights(
        self,
        progress: Progress | None = None,
        workers: int | None = None,
        allocate: Allocator | None = None,
    ) -> Iterator[tuple[str, np.ndarray]]:
        """Yield every weight as ``(canonical_name, float32 array)`` in file order.

        Dequantisation runs on a thread pool ahead of the consumer (up to ~256 MiB of output
        buffered), split into chunks so that large tensors use every worker.

        Args:
            progress: Called as ``progress(done_bytes, total_bytes)`` of stored data after each
                yielded tensor, in the iterating thread.
            workers: Threads (default: the number of CPUs, at most 8).
            allocate: ``allocate(name, shape)`` returns the C-contiguous float32 array a tensor
                is dequantised into (the weights cache passes file-backed memory maps, so
                the data is written once, straight into the cache); default ``np.empty``.

        Yields:
            Name and a C-contiguous float32 array, ``[out, in]`` for matrices (the array
            ``allocate`` returned, when given).
        """
        infos = self.weight_infos
        total = sum(t.nbytes for t in infos)
        pending: collections.deque[tuple[GGUFTensorInfo, np.ndarray, list[Future[None]]]] = collections.deque()
        done_bytes = 0

        def take() -> tuple[str, np.ndarray]:
            nonlocal done_bytes
            info, flat, futures = pending.popleft()
            for f in futures:
                f.result()
            done_bytes += info.nbytes
            if progress is not None:
                progress(done_bytes, total)
            return info.name, self._finish(info, flat)

        with ThreadPoolExecutor(max_workers=workers or min(os.cpu_count() or 1, 8), thread_name_prefix="pie-dequant") as pool:
            try:
                buffered = 0
                for info in infos:
                    target = allocate(info.name, info.shape) if allocate else np.empty(info.shape, np.float32)
                    out = target.reshape(-1)  # a view: C-contiguous by contract
                    raw = self.file.raw(info)
                    jobs = chunk_jobs(info.qtype, out.size)
                    pending.append((info, out, [pool.submit(dequantize_into, raw, info.qtype, out, a, b) for a, b in jobs]))
                    buffered += out.nbytes
                    while pending and (buffered >= _LOOKAHEAD_BYTES or all(f.done() for f in pending[0][2])):
                        buffered -= pending[0][1].nbytes
                        yield take()
                while pending:
                    yield take()
            finally:
                for _, _, futures in pending:
                    for f in futures:
                        f.cancel()


def read_gguf(path: str | Path) -> tuple[ModelSpec, Callable[..., Iterator[tuple[str, np.ndarray]]]]:
    """Read a GGUF checkpoint.

    Args:
        path: The ``.gguf`` file.

    Returns:
        The spec and a callable ``weights(progress=None, workers=None, allocate=None)`` returning a fresh
        iterator over canonical float32 weights each time it is called (see
        :meth:`GGUFCheckpoint.weights`).

    Raises:
        InvalidInput: Not a readable GGUF file.
        Unsupported: An architecture or option this engine cannot run.
    """
    checkpoint = GGUFCheckpoint(path)
    return checkpoint.spec, checkpoint.weights
