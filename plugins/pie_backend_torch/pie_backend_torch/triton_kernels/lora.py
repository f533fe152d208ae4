"""The grouped LoRA delta of one projection for every adapter group of a batch (Punica's BGMV):
``out[t, p*W:(p+1)*W] += (a[g, p*k:(p+1)*k] @ x[t]) @ b[g, p]`` for each token ``t`` of group
``g = index[t]`` (-1: none), the groups' weights stacked (``a`` ``[G, P * k, in]``, ``b``
``[G, P, k, W]``; :func:`pie_backend_torch.lora_step.stack`).

Two kernels: the shrink, one program per (token, block of ranks), writes ``u = a[g] @ x[t]`` in
float32; the expand, one per (token, part, block of columns), adds ``u @ b[g, p]`` to the output
in float32 and stores it in the output's dtype (one rounding). Tokens without a group do nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["lora_add"]


@triton.jit
def _shrink_kernel(x_ptr, x_stride, a_ptr, u_ptr, index_ptr, IN, R, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    g = tl.load(index_ptr + t)
    rank = tl.where(g >= 0, R, 0)  # a token without a group reads and writes nothing
    g = tl.maximum(g, 0).to(tl.int64)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, IN, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + t.to(tl.int64) * x_stride + cols, mask=cols < IN, other=0.0).to(tl.float32)
        ok = (rows[:, None] < rank) & (cols[None, :] < IN)
        a = tl.load(a_ptr + (g * R + rows[:, None]) * IN + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(u_ptr + t.to(tl.int64) * R + rows, acc, mask=rows < rank)


@triton.jit
def _expand_kernel(u_ptr, b_ptr, out_ptr, out_stride, index_ptr, P, K, W, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    p = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    g = tl.load(index_ptr + t)
    width = tl.where(g >= 0, W, 0)  # a token without a group reads and writes nothing
    rank = tl.where(g >= 0, K, 0)
    g = tl.maximum(g, 0).to(tl.int64)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j0 in range(0, K, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        u = tl.load(u_ptr + t.to(tl.int64) * P * K + p * K + j, mask=j < rank, other=0.0)
        ok = (j[:, None] < rank) & (cols[None, :] < width)
        b = tl.load(b_ptr + ((g * P + p) * K + j[:, None]) * W + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        acc += tl.sum(u[:, None] * b, axis=0)
    where = out_ptr + t.to(tl.int64) * out_stride + p * W + cols
    ok = cols < width
    y = tl.load(where, mask=ok, other=0.0).to(tl.float32) + acc
    tl.store(where, y.to(out_ptr.dtype.element_ty), mask=ok)


def lora_add(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> None:
    """Add every token's group's LoRA delta to ``out`` in place.

    Args:
        x: ``[N, in]`` the projection's input.
        out: ``[N, P * W]`` the projection's output (rows contiguous), updated in place.
        a: ``[G, P * k, in]`` each group's ``A`` parts, contiguous.
        b: ``[G, P, k, W]`` each group's ``(scaling * B).T`` parts, contiguous.
        index: int64 ``[N]``: each token's group, -1 for none.
    """
    n, inp = x.shape
    groups, parts, k, width = b.shape
    if out.stride(1) != 1:
        raise ValueError("lora_add needs out with contiguous rows")
    if x.stride(1) != 1:
        x = x.contiguous()
    if a.shape != (groups, parts * k, inp) or out.shape != (n, parts * width) or index.shape != (n,):
        raise ValueError(f"lora_add: a {tuple(a.shape)}, b {tuple(b.shape)}, x {tuple(x.shape)}, out "
                         f"{tuple(out.shape)} and index {tuple(index.shape)} do not fit together")
    if n == 0:
        return
    a, b = a.contiguous(), b.contiguous()
    u = torch.empty((n, parts * k), dtype=torch.float32, device=x.device)
    block_r = triton.next_power_of_2(min(parts * k, 16))
    _shrink_kernel[(n, triton.cdiv(parts * k, block_r))](
        x, x.stride(0), a, u, index, inp, parts * k, BLOCK_R=block_r, BLOCK_K=128
    )
    block_n = 128
    _expand_kernel[(n, parts, triton.cdiv(width, block_n))](
        u, b, out, out.stride(0), index, parts, k, width, BLOCK_R=triton.next_power_of_2(min(k, 16)), BLOCK_N=block_n
    )
