"""The Triton kernels wired into the forward: one batch plan, then per layer RoPE + KV write and
paged attention."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton

from pie_core.backend_kit import ForwardBatch, ModelSpec, kv_lengths

from pie_backend_torch.kv_cache import KvCache
from pie_backend_torch.rope import Rotation
from pie_backend_torch.triton_kernels.paged_attention import paged_attention
from pie_backend_torch.triton_kernels.rope_kv import rope_and_write_kv

__all__ = ["TritonPlan", "TritonAttention", "tile_block_m", "plan_tiles"]


@dataclass(frozen=True, slots=True)
class TritonPlan:
    """A batch in the form the kernels read (all int32 unless said)."""

    write_index: torch.Tensor  # int64 [N] flat pool slot of each token
    positions: torch.Tensor  # [N]
    write_slots: torch.Tensor  # [N] slot within the request
    qo_indptr: torch.Tensor  # [R + 1]
    page_indptr: torch.Tensor  # [R + 1]
    page_indices: torch.Tensor  # [P]
    kv_len: torch.Tensor  # [R]
    mask_indptr: torch.Tensor  # int64 [R + 1]
    mask_data: torch.Tensor  # uint8 (at least one entry)
    tile_req: torch.Tensor  # [T]
    tile_start: torch.Tensor  # [T]
    block_m: int
    window: int | None


def tile_block_m(group: int, max_tokens: int) -> int:
    """Query tokens per tile: enough rows (tokens x padded head group) for a 16-row matrix op."""
    group_pad = triton.next_power_of_2(group)
    least = max(1, 16 // group_pad)
    return least if max_tokens <= 1 else max(least, 64 // group_pad)


def plan_tiles(qo_indptr: np.ndarray, block_m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tile_req, tile_start)`` int32: every request cut into tiles of ``block_m`` tokens."""
    n_tok = np.diff(qo_indptr).astype(np.int64)
    counts = -(-n_tok // block_m)
    req = np.repeat(np.arange(len(n_tok)), counts)
    first_tile = np.concatenate([[0], np.cumsum(counts)[:-1]])
    within = np.arange(int(counts.sum())) - np.repeat(first_tile, counts)
    return req.astype(np.int32), (qo_indptr[req] + within * block_m).astype(np.int32)


class TritonAttention:
    """Per-layer Triton work of one model over its KV cache."""

    def __init__(self, spec: ModelSpec, cache: KvCache) -> None:
        self.spec = spec
        self.cache = cache

    def plan(self, batch: ForwardBatch, index: np.ndarray, window: int | None) -> TritonPlan:
        """Move the batch's tables to the device (``index``: flat write slots, int64)."""
        dev = self.cache.device.k.device

        def on(a: np.ndarray, dtype: type) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype)).to(dev)

        block_m = tile_block_m(self.spec.num_heads // self.spec.num_kv_heads, int(np.diff(batch.qo_indptr).max()))
        tile_req, tile_start = plan_tiles(batch.qo_indptr, block_m)
        mask = batch.mask_data.view(np.uint8) if batch.mask_data.size else np.zeros(1, np.uint8)
        return TritonPlan(
            write_index=on(index, np.int64),
            positions=on(batch.positions, np.int32),
            write_slots=on(batch.kv_write_slots, np.int32),
            qo_indptr=on(batch.qo_indptr, np.int32),
            page_indptr=on(batch.kv_page_indptr, np.int32),
            page_indices=on(batch.kv_page_indices, np.int32),
            kv_len=on(kv_lengths(batch, self.cache.page_size), np.int32),
            mask_indptr=on(batch.mask_indptr, np.int64),
            mask_data=on(mask, np.uint8),
            tile_req=on(tile_req, np.int32),
            tile_start=on(tile_start, np.int32),
            block_m=block_m,
            window=window,
        )

    def rope_and_write(
        self,
        layer: int,
        qkv: torch.Tensor,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        eps: float,
        rot: Rotation,
        plan: TritonPlan,
    ) -> torch.Tensor:
        """Queries ``[N, heads, head_dim]`` (rotated, scaled); K/V written to the pool."""
        ks, vs = self.cache.slots(layer)
        spec = self.spec
        return rope_and_write_kv(
            qkv, rot.cos, rot.sin, ks, vs, plan.write_index, spec.num_heads, spec.num_kv_heads, spec.scale, q_norm, k_norm, eps
        )

    def attend(self, layer: int, q: torch.Tensor, plan: TritonPlan, sliding: bool, softcap: float | None) -> torch.Tensor:
        """``[N, heads * head_dim]`` attention outputs of one layer."""
        ks, vs = self.cache.slots(layer)
        return paged_attention(
            q,
            ks,
            vs,
            self.cache.device.pos.view(-1),
            plan.tile_req,
            plan.tile_start,
            plan.block_m,
            plan.qo_indptr,
            plan.page_indptr,
            plan.page_indices,
            plan.kv_len,
            plan.write_slots,
            plan.positions,
            plan.mask_indptr,
            plan.mask_data,
            self.cache.page_size,
            window=plan.window if sliding else None,
            softcap=softcap,
        )
