"""The paged KV store: device pool, host pool, and page copies between them.

Each pool holds, for every layer, K and V as ``[pages, page_size, kv_heads, head_dim]`` float32,
plus the RoPE position of every slot (``[pages, page_size]`` int32), which sliding-window layers
need to hide old keys. Pool memory is allocated lazily by the OS (``np.zeros``), so an unused
page costs nothing until it is first written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pie_core.backend_kit import CopyKind

__all__ = ["KvPool", "KvStore", "page_bytes"]


def page_bytes(num_layers: int, page_size: int, kv_heads: int, head_dim: int) -> int:
    """Bytes one page takes: K and V of every layer plus the slot positions."""
    return 2 * num_layers * page_size * kv_heads * head_dim * 4 + page_size * 4


@dataclass(slots=True)
class KvPool:
    """One pool of pages (device or host)."""

    k: np.ndarray  # [layers, pages, page_size, kv_heads, head_dim]
    v: np.ndarray
    pos: np.ndarray  # [pages, page_size]

    @classmethod
    def allocate(cls, layers: int, pages: int, page_size: int, kv_heads: int, head_dim: int) -> KvPool:
        shape = (layers, pages, page_size, kv_heads, head_dim)
        return cls(
            k=np.zeros(shape, dtype=np.float32),
            v=np.zeros(shape, dtype=np.float32),
            pos=np.zeros((pages, page_size), dtype=np.int32),
        )

    @property
    def num_pages(self) -> int:
        return int(self.pos.shape[0])

    def check(self, ids: np.ndarray, what: str) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_pages):
            bad = int(ids[(ids < 0) | (ids >= self.num_pages)][0])
            raise ValueError(f"{what} page id {bad} is out of range [0, {self.num_pages})")
        return ids


class KvStore:
    """Device and host KV pools of one model."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        num_host_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
    ) -> None:
        if page_size < 1 or num_pages < 1:
            raise ValueError(f"page_size and num_pages must be >= 1, got {page_size} and {num_pages}")
        self.page_size = page_size
        self.device = KvPool.allocate(num_layers, num_pages, page_size, kv_heads, head_dim)
        self.host = KvPool.allocate(num_layers, num_host_pages, page_size, kv_heads, head_dim)

    def write_positions(self, pages: np.ndarray, offsets: np.ndarray, positions: np.ndarray) -> None:
        """Record the RoPE positions of the slots written this pass."""
        self.device.pos[pages, offsets] = positions

    def write(self, layer: int, pages: np.ndarray, offsets: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store one layer's K and V ``[N, kv_heads, head_dim]`` at ``(page, offset)`` slots."""
        self.device.k[layer, pages, offsets] = k
        self.device.v[layer, pages, offsets] = v

    def copy(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole pages (every layer's K and V, and slot positions).

        Raises:
            ValueError: Lengths differ, an id is out of range, or the kind is unknown.
        """
        if len(src) != len(dst):
            raise ValueError(
                f"copy_pages needs as many destinations as sources, got {len(src)} and {len(dst)}"
            )
        kind = CopyKind(int(kind))
        if kind == CopyKind.DEVICE_TO_DEVICE:
            source, target = self.device, self.device
        elif kind == CopyKind.DEVICE_TO_HOST:
            source, target = self.device, self.host
        else:
            source, target = self.host, self.device
        s = source.check(src, "source")
        d = target.check(dst, "destination")
        if len(np.unique(d)) != len(d):
            raise ValueError("copy_pages destinations must be distinct")
        # Fancy indexing on the right makes a copy first, so overlapping src/dst are safe.
        target.k[:, d] = source.k[:, s]
        target.v[:, d] = source.v[:, s]
        target.pos[d] = source.pos[s]
