"""The paged KV cache: a device pool, a host pool, and whole-page copies between them.

Each pool holds K and V as ``[layers, kv_heads, pages, page_size, head_dim]`` in the compute
dtype, plus the RoPE position of every slot (``[pages, page_size]`` int32, which sliding-window
layers need). Heads lead so that a request's pages, gathered or sliced, are already
``[kv_heads, length, head_dim]``, the shape attention multiplies by; and a run of consecutive
page ids is a view, read in place.

On a CPU the pools are allocated through ``numpy.zeros`` (calloc), so an unused page costs no
memory until it is first written; on CUDA the host pool is pinned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pie_core.backend_kit import CopyKind

__all__ = ["KvPool", "KvCache", "page_bytes"]

_NUMPY_STORAGE = {
    torch.float32: (np.float32, None),
    torch.bfloat16: (np.int16, torch.bfloat16),
    torch.float16: (np.float16, None),
    torch.int32: (np.int32, None),
}


def page_bytes(num_layers: int, page_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one page takes: K and V of every layer plus the slot positions."""
    elem = torch.empty(0, dtype=dtype).element_size()
    return 2 * num_layers * page_size * kv_heads * head_dim * elem + page_size * 4


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, pinned: bool) -> torch.Tensor:
    if device.type == "cpu" and not pinned:
        np_dtype, view = _NUMPY_STORAGE[dtype]
        out = torch.from_numpy(np.zeros(shape, dtype=np_dtype))
        return out.view(view) if view is not None else out
    return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pinned)


@dataclass(slots=True)
class KvPool:
    """One pool of pages (device or host)."""

    k: torch.Tensor  # [layers, kv_heads, pages, page_size, head_dim]
    v: torch.Tensor
    pos: torch.Tensor  # [pages, page_size] int32
    usable: int = -1  # pages page ids may name (-1: all)

    @classmethod
    def allocate(
        cls,
        layers: int,
        pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        pinned: bool = False,
    ) -> KvPool:
        shape = (layers, kv_heads, pages, page_size, head_dim)
        return cls(
            k=_zeros(shape, dtype, device, pinned),
            v=_zeros(shape, dtype, device, pinned),
            pos=_zeros((pages, page_size), torch.int32, device, pinned),
        )

    @property
    def num_pages(self) -> int:
        return int(self.pos.shape[0]) if self.usable < 0 else self.usable

    def check(self, ids: np.ndarray, what: str) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_pages):
            bad = int(ids[(ids < 0) | (ids >= self.num_pages)][0])
            raise ValueError(f"{what} page id {bad} is out of range [0, {self.num_pages})")
        return ids


class KvCache:
    """Device and host KV pools of one model."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        num_host_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if page_size < 1 or num_pages < 1:
            raise ValueError(f"page_size and num_pages must be >= 1, got {page_size} and {num_pages}")
        self.page_size = page_size
        # One page more than the core may address: a scratch page for the padding rows of
        # captured decode graphs (see cuda_graphs), never read by a real request.
        self.scratch_page = num_pages
        self.device = KvPool.allocate(num_layers, num_pages + 1, page_size, kv_heads, head_dim, dtype, device)
        self.device.usable = num_pages
        self.host = KvPool.allocate(
            num_layers,
            num_host_pages,
            page_size,
            kv_heads,
            head_dim,
            dtype,
            torch.device("cpu"),
            pinned=device.type == "cuda",
        )
        # Host mirror of the device pool's slot positions (the batch planner reads it); on a CPU
        # it is the same memory as the pool's own.
        self.positions = np.zeros((num_pages + 1, page_size), dtype=np.int32)
        if device.type == "cpu":
            self.device.pos = torch.from_numpy(self.positions)

    def slots(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V as ``[kv_heads, pages * page_size, head_dim]`` views."""
        k, v = self.device.k[layer], self.device.v[layer]
        kvh, pages, ps, d = k.shape
        return k.view(kvh, pages * ps, d), v.view(kvh, pages * ps, d)

    def write(self, layer: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one layer's K and V ``[N, kv_heads, head_dim]`` at flat slots ``page * page_size + offset``."""
        ks, vs = self.slots(layer)
        ks.index_copy_(1, index, k.transpose(0, 1).to(ks.dtype))
        vs.index_copy_(1, index, v.transpose(0, 1).to(vs.dtype))

    def write_positions(self, index: np.ndarray, positions: np.ndarray, device: bool = True) -> None:
        """Record the RoPE positions of the flat slots written this pass (``device=False``: in the
        host mirror only, for a caller that writes the device's copy itself, as a decode graph does)."""
        self.positions.reshape(-1)[index] = positions
        if device and self.device.pos.device.type != "cpu":
            self.device.pos.view(-1)[torch.from_numpy(index).to(self.device.pos.device)] = torch.from_numpy(
                np.ascontiguousarray(positions, dtype=np.int32)
            ).to(self.device.pos.device)

    def copy(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole pages (every layer's K and V, and slot positions).

        Raises:
            ValueError: Lengths differ, an id is out of range, destinations repeat, or the kind
                is unknown.
        """
        if len(src) != len(dst):
            raise ValueError(f"copy_pages needs as many destinations as sources, got {len(src)} and {len(dst)}")
        try:
            kind = CopyKind(int(kind))
        except ValueError:
            raise ValueError(f"unknown copy kind {kind}; expected one of {[int(k) for k in CopyKind]}") from None
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
        if not len(s):
            return
        si = torch.from_numpy(s).to(source.k.device)
        di = torch.from_numpy(d).to(target.k.device)
        # index_select copies first, so overlapping sources and destinations are safe. A copy to the
        # host blocks: index_copy_ reads it on the CPU at once, and an asynchronous device-to-host
        # copy may not have landed by then (copies to the device are ordered on the stream).
        dev = target.k.device
        non_blocking = dev.type != "cpu"
        target.k.index_copy_(2, di, source.k.index_select(2, si).to(dev, non_blocking=non_blocking))
        target.v.index_copy_(2, di, source.v.index_select(2, si).to(dev, non_blocking=non_blocking))
        if target is self.device:
            moved = self.positions[s] if source is self.device else source.pos.numpy()[s]
            self.positions[d] = moved
            if dev.type != "cpu":
                target.pos[di] = torch.from_numpy(moved).to(dev)
        else:
            target.pos[di] = torch.from_numpy(self.positions[s])
