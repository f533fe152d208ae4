"""Paged attention in one Triton kernel: prefill chunks, custom masks and decode rows alike.

Each program takes a *tile* (up to ``BLOCK_M`` consecutive query tokens of one request) and one
KV head, with that head's query-head group stacked as rows (``BLOCK_M x GROUP_PAD`` rows). It
walks the request's KV slots ``BLOCK_N`` at a time, reading each slot's page id from the page
table and the K/V rows straight out of the pool (nothing is gathered or copied), applies the
mask (default: slot <= the token's write slot; or the request's custom mask bytes; plus the
sliding window through the slots' recorded positions), and keeps an online softmax. A row that
sees no key gets zeros, as the reference does.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["paged_attention", "tanh"]


@triton.jit
def tanh(x):
    """``tanh`` from ``exp`` (the interpreter and every backend have it)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    out_ptr,
    tile_req_ptr,
    tile_start_ptr,
    qo_indptr_ptr,
    page_indptr_ptr,
    page_indices_ptr,
    kv_len_ptr,
    write_slot_ptr,
    positions_ptr,
    mask_indptr_ptr,
    mask_ptr,
    head_stride,
    softcap,
    window,
    H: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
    IEEE: tl.constexpr,
    DOT: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    r = tl.load(tile_req_ptr + tile)
    first = tl.load(tile_start_ptr + tile)
    q_end = tl.load(qo_indptr_ptr + r + 1)
    q_begin = tl.load(qo_indptr_ptr + r)
    rows = tl.arange(0, BLOCK_M * GROUP_PAD)
    tok = first + rows // GROUP_PAD
    hj = rows % GROUP_PAD
    row_ok = (tok < q_end) & (hj < GROUP)
    head = kvh * GROUP + hj
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    q = tl.load(
        q_ptr + (tok * H + head)[:, None] * D + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0
    )
    wslot = tl.load(write_slot_ptr + tok, mask=row_ok, other=-1)
    qpos = tl.load(positions_ptr + tok, mask=row_ok, other=0)
    kv_len = tl.load(kv_len_ptr + r)
    pbase = tl.load(page_indptr_ptr + r)
    m0 = tl.load(mask_indptr_ptr + r)
    # the request's custom-mask flag as a row vector (a scalar bool does not combine with
    # tensors under the interpreter)
    custom = (tl.zeros([BLOCK_M * GROUP_PAD], tl.int64) + tl.load(mask_indptr_ptr + r + 1) - m0) > 0
    m_i = tl.full([BLOCK_M * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, D_PAD], tl.float32)
    k_base = k_ptr + kvh * head_stride
    v_base = v_ptr + kvh * head_stride
    for start in range(0, kv_len, BLOCK_N):
        s = start + tl.arange(0, BLOCK_N)
        s_ok = s < kv_len
        page = tl.load(page_indices_ptr + pbase + s // PAGE, mask=s_ok, other=0)
        flat = page.to(tl.int64) * PAGE + s % PAGE
        kv_mask = s_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + flat[:, None] * D + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            scores = tl.dot(q.to(DOT), tl.trans(k.to(DOT)), input_precision="ieee")
        else:
            scores = tl.dot(q.to(DOT), tl.trans(k.to(DOT)))
        if SOFTCAP:
            scores = softcap * tanh(scores / softcap)
        both = row_ok[:, None] & s_ok[None, :]
        bits = tl.load(
            mask_ptr + m0 + (tok - q_begin).to(tl.int64)[:, None] * kv_len + s[None, :],
            mask=both & custom[:, None],
            other=0,
        )
        allowed = tl.where(custom[:, None], bits != 0, s[None, :] <= wslot[:, None]) & both
        if SLIDING:
            kpos = tl.load(pos_ptr + flat, mask=s_ok, other=0)
            allowed = allowed & (kpos[None, :] > qpos[:, None] - window)
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + flat[:, None] * D + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype).to(DOT), v.to(DOT), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype).to(DOT), v.to(DOT))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + (tok * H + head)[:, None] * D + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand type of the matrix products: the data's own, except under the interpreter, whose
    16-bit float products are wrong (triton 3.x), so they run in float32 there."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return tl.float32
    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def _pow2(n: int, least: int = 1) -> int:
    return max(least, triton.next_power_of_2(n))


def paged_attention(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    slot_pos: torch.Tensor,
    tile_req: torch.Tensor,
    tile_start: torch.Tensor,
    block_m: int,
    qo_indptr: torch.Tensor,
    page_indptr: torch.Tensor,
    page_indices: torch.Tensor,
    kv_len: torch.Tensor,
    write_slots: torch.Tensor,
    positions: torch.Tensor,
    mask_indptr: torch.Tensor,
    mask_data: torch.Tensor,
    page_size: int,
    window: int | None = None,
    softcap: float | None = None,
    block_n: int = 32,
) -> torch.Tensor:
    """Attention of ``q`` over the paged pool, for one layer.

    Args:
        q: ``[N, heads, head_dim]`` queries, RoPE applied and pre-scaled.
        k_slots, v_slots: The layer's pool as ``[kv_heads, pages * page_size, head_dim]``.
        slot_pos: int32 ``[pages * page_size]`` RoPE position of every slot (sliding windows).
        tile_req, tile_start: int32 ``[T]``: each tile's request and first token.
        block_m: Tokens per tile (the tiles were cut with it).
        qo_indptr, page_indptr: int32 ``[R + 1]``; page_indices int32; kv_len int32 ``[R]``.
        write_slots, positions: int32 ``[N]`` (each token's own slot and RoPE position).
        mask_indptr: int64 ``[R + 1]`` into ``mask_data`` (uint8, 1 = attend; row-major
            ``[n_r, kv_len_r]`` for requests with a custom mask).
        page_size: Slots per page.
        window: Sliding window of this layer, or None.
        softcap: Attention logit soft-capping, or None.
        block_n: Key slots per inner step.

    Returns:
        ``[N, heads * head_dim]`` in ``q``'s dtype.
    """
    n, heads, d = q.shape
    kv_heads = k_slots.shape[0]
    group = heads // kv_heads
    group_pad = _pow2(group)
    out = torch.empty((n, heads, d), dtype=q.dtype, device=q.device)
    if tile_req.numel() == 0:
        return out.view(n, heads * d)
    grid = (tile_req.numel(), kv_heads)
    _paged_attention_kernel[grid](
        q.contiguous(),
        k_slots,
        v_slots,
        slot_pos,
        out,
        tile_req,
        tile_start,
        qo_indptr,
        page_indptr,
        page_indices,
        kv_len,
        write_slots,
        positions,
        mask_indptr,
        mask_data,
        k_slots.stride(0),
        float(softcap or 1.0),
        int(window or 0),
        H=heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        D=d,
        D_PAD=_pow2(d, 16),
        PAGE=page_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        SLIDING=window is not None,
        SOFTCAP=softcap is not None,
        IEEE=q.dtype == torch.float32,
        DOT=_dot_dtype(q.dtype),
    )
    return out.view(n, heads * d)
