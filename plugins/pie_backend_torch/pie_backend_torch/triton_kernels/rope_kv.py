"""Fused Q/K normalisation (when the model has it), RoPE, and the K/V write into the paged pool.

One program per (token, head) of the fused QKV projection: Q heads are normalised, rotated and
scaled into the query buffer; K heads normalised, rotated and stored at the token's pool slot;
V heads stored there as they are. The projection is read once and written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rope_and_write_kv"]


@triton.jit
def _rope_kv_kernel(
    qkv_ptr,
    qkv_stride,
    cos_ptr,
    sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    q_out_ptr,
    k_ptr,
    v_ptr,
    head_stride,
    index_ptr,
    q_scale,
    eps,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    t = tl.program_id(0)
    head = tl.program_id(1)
    offs = tl.arange(0, HALF_PAD)
    ok = offs < HALF
    src = qkv_ptr + t.to(tl.int64) * qkv_stride + head * D
    x1 = tl.load(src + offs, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    slot = tl.load(index_ptr + t)
    if head < H + KV:
        if QK_NORM:
            rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / D + eps)
            if head < H:
                w1 = tl.load(q_norm_ptr + offs, mask=ok, other=0.0).to(tl.float32)
                w2 = tl.load(q_norm_ptr + HALF + offs, mask=ok, other=0.0).to(tl.float32)
            else:
                w1 = tl.load(k_norm_ptr + offs, mask=ok, other=0.0).to(tl.float32)
                w2 = tl.load(k_norm_ptr + HALF + offs, mask=ok, other=0.0).to(tl.float32)
            x1 = x1 * rstd * w1
            x2 = x2 * rstd * w2
        c = tl.load(cos_ptr + t * HALF + offs, mask=ok, other=0.0)
        s = tl.load(sin_ptr + t * HALF + offs, mask=ok, other=0.0)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        if head < H:
            dst = q_out_ptr + (t.to(tl.int64) * H + head) * D
            tl.store(dst + offs, (y1 * q_scale).to(q_out_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF + offs, (y2 * q_scale).to(q_out_ptr.dtype.element_ty), mask=ok)
        else:
            dst = k_ptr + (head - H) * head_stride + slot * D
            tl.store(dst + offs, y1.to(k_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF + offs, y2.to(k_ptr.dtype.element_ty), mask=ok)
    else:
        dst = v_ptr + (head - H - KV) * head_stride + slot * D
        tl.store(dst + offs, x1.to(v_ptr.dtype.element_ty), mask=ok)
        tl.store(dst + HALF + offs, x2.to(v_ptr.dtype.element_ty), mask=ok)


def rope_and_write_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    index: torch.Tensor,
    heads: int,
    kv_heads: int,
    q_scale: float,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Rotate Q and K of the fused projection, write K and V to the pool, return the queries.

    Args:
        qkv: ``[N, (heads + 2 * kv_heads) * head_dim]``: Q heads, then K, then V.
        cos, sin: float32 ``[N, head_dim // 2]`` RoPE tables of the tokens' positions.
        k_slots, v_slots: The layer's pool, ``[kv_heads, pages * page_size, head_dim]``.
        index: int64 ``[N]`` flat pool slot of each token.
        heads, kv_heads: Query and KV head counts.
        q_scale: Softmax scale folded into the queries.
        q_norm, k_norm: Per-head RMSNorm weights ``[head_dim]`` (qwen3, gemma3), or None.
        eps: RMSNorm epsilon.

    Returns:
        ``[N, heads, head_dim]`` queries in ``qkv``'s dtype.
    """
    n = qkv.shape[0]
    d = k_slots.shape[2]
    q = torch.empty((n, heads, d), dtype=qkv.dtype, device=qkv.device)
    if n == 0:
        return q
    norm = q_norm is not None and k_norm is not None
    _rope_kv_kernel[(n, heads + 2 * kv_heads)](
        qkv,
        qkv.stride(0),
        cos.contiguous(),
        sin.contiguous(),
        q_norm if norm else cos,
        k_norm if norm else cos,
        q,
        k_slots,
        v_slots,
        k_slots.stride(0),
        index,
        float(q_scale),
        float(eps),
        H=heads,
        KV=kv_heads,
        D=d,
        HALF=d // 2,
        HALF_PAD=triton.next_power_of_2(d // 2),
        QK_NORM=norm,
    )
    return q
