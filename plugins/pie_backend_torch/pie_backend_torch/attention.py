"""Paged attention with plain torch ops (the CPU path, and the CUDA fallback).

Queries arrive as ``[N, heads, head_dim]``, RoPE applied and pre-scaled; the result is
``[N, heads * head_dim]``. Query head ``h`` reads KV head ``h // (heads // kv_heads)``, as
Hugging Face's ``repeat_kv`` does, without repeating K/V: queries are grouped per KV head.

Keys are read from the pool as ``[kv_heads, length, head_dim]``: a slice of the pool for a
request whose pages are consecutive (in place), else a gather of the batch's own pages (never
the whole cache). Decode groups run as two batched matmuls around a float32 softmax (cheaper
than the fused kernel for one query row), in float32 on a CPU: torch's bf16 batched matmul
takes the slow path at these shapes (2-3x the float32 time, including the casts); prefill blocks and custom masks go through
``scaled_dot_product_attention`` with a boolean mask. A query that may see no key gets zeros.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F

from pie_backend_torch.kv_cache import KvCache
from pie_backend_torch.layout import BatchPlan, Block, DecodeGroup

__all__ = ["attend"]


def _keys(ks: torch.Tensor, slots: torch.Tensor | None, first: int, length: int) -> torch.Tensor:
    """``[kv_heads, (G,) length, head_dim]``: in place when ``slots`` is None."""
    if slots is None:
        return ks[:, first : first + length]
    # index_select over the flattened ids: ~2.5x faster than advanced indexing on a CPU
    return ks.index_select(1, slots.reshape(-1)).view(ks.shape[0], *slots.shape, ks.shape[2])


@contextmanager
def _serial(on: bool) -> Iterator[None]:
    """Run torch's CPU ops on one thread inside the block when ``on``."""
    threads = torch.get_num_threads()
    if not on or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _weighted(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, softcap: float | None
) -> torch.Tensor:
    """q ``[KV, B, R, d]``, k/v ``[KV, B, L, d]``, bias ``[B, R or 1, L]`` float32 -> ``[KV, B, R, d]``."""
    scores = torch.matmul(q, k.transpose(-1, -2))
    if softcap is not None:
        scores = torch.tanh(scores.float() / softcap) * softcap
    weights = torch.softmax(scores + bias, dim=-1)  # promotes to float32
    return torch.matmul(weights.to(v.dtype), v)


def _decode(q: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, g: DecodeGroup, sliding: bool, softcap: float | None) -> torch.Tensor:
    kvh, d = ks.shape[0], ks.shape[2]
    qg = q if g.tokens is None else q.index_select(0, g.tokens)
    members, heads = qg.shape[0], qg.shape[1]
    k = _keys(ks, g.slots, g.first_slot, g.length)
    v = _keys(vs, g.slots, g.first_slot, g.length)
    if g.slots is None:
        k, v = k.unsqueeze(1), v.unsqueeze(1)
    bias = g.bias_sliding if sliding and g.bias_sliding is not None else g.bias
    qh = qg.view(members, kvh, heads // kvh, d).transpose(0, 1)
    cpu = k.device.type == "cpu"
    with _serial(cpu):  # one thread: each row's products run the same way whatever the group's size
        if cpu and k.dtype != torch.float32:
            qh, k, v = qh.float(), k.float(), v.float()
        out = _weighted(qh, k, v, bias[:, None, :], softcap)  # [KV, G, group, d]
    return out.transpose(0, 1).reshape(members, heads * d).to(q.dtype)


def _block(q: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, b: Block, sliding: bool, softcap: float | None) -> torch.Tensor:
    kvh, d = ks.shape[0], ks.shape[2]
    n, heads = b.stop - b.start, q.shape[1]
    k = _keys(ks, b.slots, b.first_slot, b.kv_len)
    v = _keys(vs, b.slots, b.first_slot, b.kv_len)
    use_sliding = sliding and b.mask_sliding is not None
    mask = b.mask_sliding if use_sliding else b.mask
    blind = b.blind_sliding if use_sliding else b.blind
    assert mask is not None
    qb = q[b.start : b.stop].to(k.dtype)  # float32 queries (q4/w8a8 layers) meet a bf16 cache
    if softcap is None:
        out = F.scaled_dot_product_attention(
            qb.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=1.0, enable_gqa=True
        )[0].transpose(0, 1)
    else:
        group = heads // kvh
        qh = qb.view(n, kvh, group, d).permute(1, 2, 0, 3).reshape(kvh, 1, group * n, d)
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
        out = _weighted(qh, k.unsqueeze(1), v.unsqueeze(1), bias.repeat(group, 1)[None], softcap)
        out = out.reshape(kvh, group, n, d).permute(2, 0, 1, 3)
    out = out.reshape(n, heads * d)
    if blind is not None:  # softmax over no key: zeros, as the reference gives
        out = out.masked_fill(blind[:, None], 0.0)
    return out


def attend(q: torch.Tensor, cache: KvCache, layer: int, plan: BatchPlan, sliding: bool, softcap: float | None) -> torch.Tensor:
    """Attention of every input token over its request's KV pages, for one layer.

    Args:
        q: ``[N, heads, head_dim]`` queries, RoPE applied and pre-scaled.
        cache: The KV cache (this pass's K/V already written).
        layer: Layer index.
        plan: The batch plan.
        sliding: Whether this layer uses the sliding-window masks.
        softcap: Attention logit soft-capping, or None.

    Returns:
        ``[N, heads * head_dim]`` in ``q``'s dtype.
    """
    ks, vs = cache.slots(layer)
    if len(plan.decode) == 1 and not plan.blocks and plan.decode[0].tokens is None:
        return _decode(q, ks, vs, plan.decode[0], sliding, softcap)
    out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    for g in plan.decode:
        assert g.tokens is not None
        out.index_copy_(0, g.tokens, _decode(q, ks, vs, g, sliding, softcap))
    for b in plan.blocks:
        out[b.start : b.stop] = _block(q, ks, vs, b, sliding, softcap)
    return out
