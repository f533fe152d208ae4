"""KV pages: slot positions, the host pool, and page copies in every direction.

The device cache lives in the session (one tensor per layer and K/V, indexed by slot); this
keeps what the graph does not: each slot's RoPE position (sliding-window masks need it) and the
host pool, numpy ``[layers, 2, host pages, page_size, kv_heads, head_dim]``. Copies move whole
pages through the session's ``take`` and ``put`` graphs, so they run on the provider's device.
"""

from __future__ import annotations

import numpy as np

from pie_core.backend_kit import CopyKind

from pie_backend_tensorrt.session import GraphSession

__all__ = ["KvPages", "page_bytes"]


def page_bytes(num_layers: int, page_size: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Device bytes of one page: K and V of every layer."""
    return 2 * num_layers * page_size * kv_heads * head_dim * itemsize


def _check(ids: np.ndarray, limit: int, what: str) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
        bad = int(ids[(ids < 0) | (ids >= limit)][0])
        raise ValueError(f"{what} page id {bad} is out of range [0, {limit})")
    return ids


class KvPages:
    """Page bookkeeping of one model beside its session's cache."""

    def __init__(self, session: GraphSession, num_pages: int, host_pages: int, page_size: int,
                 num_layers: int, kv_heads: int, head_dim: int) -> None:
        self.session = session
        self.num_pages, self.host_pages, self.page_size = num_pages, host_pages, page_size
        self.num_layers = num_layers
        self.slot_pos = np.zeros(num_pages * page_size, dtype=np.int64)
        shape = (num_layers, 2, host_pages, page_size, kv_heads, head_dim)
        self.host = np.zeros(shape, dtype=session.np_dtype)
        self.host_pos = np.zeros((host_pages, page_size), dtype=np.int64)

    def _slots(self, pages: np.ndarray) -> np.ndarray:
        return (pages[:, None] * self.page_size + np.arange(self.page_size)[None, :]).reshape(-1)

    def copy(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole pages (every layer's K and V, and slot positions).

        Raises:
            ValueError: Lengths differ, an id is out of range, or destinations repeat.
        """
        if len(src) != len(dst):
            raise ValueError(f"copy_pages needs as many destinations as sources, got {len(src)} and {len(dst)}")
        kind = CopyKind(int(kind))
        from_device = kind in (CopyKind.DEVICE_TO_DEVICE, CopyKind.DEVICE_TO_HOST)
        to_device = kind in (CopyKind.DEVICE_TO_DEVICE, CopyKind.HOST_TO_DEVICE)
        s = _check(src, self.num_pages if from_device else self.host_pages, "source")
        d = _check(dst, self.num_pages if to_device else self.host_pages, "destination")
        if len(np.unique(d)) != len(d):
            raise ValueError("copy_pages destinations must be distinct")
        if not len(s):
            return
        count, ps = len(s), self.page_size
        if from_device:
            rows = [[self.session.take(layer, kv, self._slots(s)) for kv in (0, 1)] for layer in range(self.num_layers)]
            pos = self.slot_pos[self._slots(s)].reshape(count, ps)
        else:
            rows = [[self.host[layer, kv, s].reshape(count * ps, *self.host.shape[4:]) for kv in (0, 1)]
                    for layer in range(self.num_layers)]
            pos = self.host_pos[s]
        if to_device:
            for layer in range(self.num_layers):
                for kv in (0, 1):
                    self.session.put(layer, kv, self._slots(d), rows[layer][kv])
            self.slot_pos[self._slots(d)] = pos.reshape(-1)
        else:
            for layer in range(self.num_layers):
                for kv in (0, 1):
                    self.host[layer, kv, d] = rows[layer][kv].reshape(count, ps, *self.host.shape[4:])
            self.host_pos[d] = pos
