"""Sampling on the device in Triton: logit masks, temperature, top-k / top-p / min-p supports and
inverse-CDF draws, one program per sample row, without sorting the vocabulary.

The support follows :mod:`pie_core.backend_kit.sampling` exactly in structure: the top-k cut is the k-th
largest probability (found by bisection on its float bits, so it is exact), ties at the cut go
to the lower ids; the nucleus cut is the largest probability ``T`` whose "p >= T" mass reaches
``top_p`` (inside the top-k set for TOP_K_TOP_P), topped up with as few tokens equal to ``T`` as
reach the mass, lower ids first; min-p keeps ``p >= min_p * max p``. Draws walk the support in
ascending id order. Sums are float32 (the reference uses float64), so only a uniform falling
within rounding of a boundary can pick a different token.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

__all__ = ["apply_packed_mask", "triton_draw"]

@triton.jit
def _mask_kernel(logits_ptr, stride, packed_ptr, packed_stride, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    byte = tl.load(packed_ptr + row * packed_stride + offs // 8, mask=ok, other=0).to(tl.int32)
    allowed = ((byte >> (offs % 8)) & 1) != 0
    ptr = logits_ptr + row * stride + offs
    x = tl.load(ptr, mask=ok, other=0.0)
    tl.store(ptr, tl.where(allowed, x, float("-inf")), mask=ok)


def apply_packed_mask(logits: torch.Tensor, packed: np.ndarray) -> torch.Tensor:
    """Set disallowed entries of ``logits`` ``[S, V]`` (float32, in place) to ``-inf``.

    ``packed`` is ``uint8[S, ceil(V/8)]``, ``np.packbits(..., bitorder="little")`` of the allowed
    set. Returns ``logits``.
    """
    s, vocab = logits.shape
    if s == 0:
        return logits
    p = torch.from_numpy(np.ascontiguousarray(packed)).to(logits.device)
    block = 1024
    _mask_kernel[(s, triton.cdiv(vocab, block))](logits, logits.stride(0), p, p.stride(0), vocab, BLOCK=block)
    return logits


@triton.jit
def _prob(x_ptr, offs, V, t, m, inv_z):
    x = tl.load(x_ptr + offs, mask=offs < V, other=float("-inf"))
    return tl.where(offs < V, tl.exp(x / t - m) * inv_z, 0.0)


@triton.jit
def _member(p, rank, cut, miss):
    """In the set "p > cut, plus the first ``miss`` entries equal to ``cut``" (rank counts ties)."""
    return (p > cut) | ((p == cut) & (rank <= miss))


@triton.jit
def _tie_ranks(p, cut, seen):
    ties = (p == cut).to(tl.int32)
    return seen + tl.cumsum(ties, 0), seen + tl.sum(ties, 0)


@triton.jit
def _in_top_k(x_ptr, offs, V, t, m, inv_z, cut_k, miss_k, seen_k):
    p = _prob(x_ptr, offs, V, t, m, inv_z)
    rank, seen = _tie_ranks(p, cut_k, seen_k)
    return p, _member(p, rank, cut_k, miss_k) & (offs < V), seen


@triton.jit
def _count_mass(x_ptr, V, t, m, inv_z, cut_k, miss_k, thr, BLOCK: tl.constexpr):
    """Count and mass of the top-k set's entries with ``p >= thr`` (and of ``p > thr``)."""
    count_ge = 0
    mass_ge = 0.0
    count_gt = 0
    mass_gt = 0.0
    seen = 0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        p, ink, seen = _in_top_k(x_ptr, offs, V, t, m, inv_z, cut_k, miss_k, seen)
        ge = ink & (p >= thr)
        gt = ink & (p > thr)
        count_ge += tl.sum(ge.to(tl.int32), 0)
        mass_ge += tl.sum(tl.where(ge, p, 0.0), 0)
        count_gt += tl.sum(gt.to(tl.int32), 0)
        mass_gt += tl.sum(tl.where(gt, p, 0.0), 0)
    return count_ge, mass_ge, count_gt, mass_gt


@triton.jit
def _bisect(x_ptr, V, t, m, inv_z, cut_k, miss_k, goal, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """Largest float ``T`` in [0, 1] with count (or mass, and at least one entry) of top-k entries
    ``p >= T`` reaching ``goal``."""
    lo = 0
    hi = 0x3F800000
    for _ in range(31):
        mid = (lo + hi + 1) // 2
        thr = tl.cast(mid, tl.float32, bitcast=True)
        count_ge, mass_ge, _c, _m = _count_mass(x_ptr, V, t, m, inv_z, cut_k, miss_k, thr, BLOCK)
        if BY_MASS:
            enough = (mass_ge >= goal) & (count_ge >= 1)
        else:
            enough = count_ge >= goal
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    return tl.cast(lo, tl.float32, bitcast=True)


@triton.jit
def _sample_kernel(
    logits_ptr,
    stride,
    kind_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    u_ptr,
    u_stride,
    draws_ptr,
    out_ptr,
    out_stride,
    V,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    x_ptr = logits_ptr + row.to(tl.int64) * stride
    kind = tl.load(kind_ptr + row)
    t = tl.load(temp_ptr + row)
    k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    n_draws = tl.load(draws_ptr + row)
    m = float("-inf")
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < V, other=float("-inf"))
        m = tl.maximum(m, tl.max(x / t, 0))
    z = 0.0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < V, other=float("-inf"))
        z += tl.sum(tl.exp(x / t - m), 0)
    inv_z = 1.0 / z
    # top-k set (kinds TOP_K = 1, TOP_K_TOP_P = 4); other kinds keep everything (cut -1)
    cut_k = -1.0
    miss_k = 0
    if (kind == 1) | (kind == 4):
        k_eff = tl.where((k > 0) & (k < V), k, V)
        cut_k = _bisect(x_ptr, V, t, m, inv_z, -1.0, 0, k_eff, False, BLOCK)
        _a, _b, above, _d = _count_mass(x_ptr, V, t, m, inv_z, -1.0, 0, cut_k, BLOCK)
        miss_k = k_eff - above
    # nucleus inside the top-k set (TOP_P = 2, TOP_K_TOP_P = 4)
    cut_p = -1.0
    miss_p = 0
    if (kind == 2) | (kind == 4):
        _a, total, _c, _d = _count_mass(x_ptr, V, t, m, inv_z, cut_k, miss_k, 0.0, BLOCK)
        goal = top_p * total
        cut_p = _bisect(x_ptr, V, t, m, inv_z, cut_k, miss_k, goal, True, BLOCK)
        _a, _b, _c, mass_above = _count_mass(x_ptr, V, t, m, inv_z, cut_k, miss_k, cut_p, BLOCK)
        need = tl.where(cut_p > 0, tl.ceil((goal - mass_above) / tl.where(cut_p > 0, cut_p, 1.0)), 1.0)
        miss_p = tl.maximum(need, 1.0).to(tl.int32)
    thr_min = tl.where(kind == 3, min_p * inv_z, -1.0)  # MIN_P = 3: p >= min_p * max p
    # support mass and its last token
    mass = 0.0
    last = 0
    seen_k = 0
    seen_p = 0
    for s in range(0, V, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        p, ink, seen_k_next = _in_top_k(x_ptr, offs, V, t, m, inv_z, cut_k, miss_k, seen_k)
        rank_p, seen_p_next = _tie_ranks(tl.where(ink, p, -2.0), cut_p, seen_p)
        w = tl.where(ink & _member(p, rank_p, cut_p, miss_p) & (p >= thr_min), p, 0.0)
        mass += tl.sum(w, 0)
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs, 0), 0))
        seen_k = seen_k_next
        seen_p = seen_p_next
    for j in range(0, n_draws):
        target = tl.load(u_ptr + row * u_stride + j).to(tl.float32) * mass
        run = 0.0
        pick = V
        seen_k = 0
        seen_p = 0
        for s in range(0, V, BLOCK):
            offs = s + tl.arange(0, BLOCK)
            p, ink, seen_k_next = _in_top_k(x_ptr, offs, V, t, m, inv_z, cut_k, miss_k, seen_k)
            rank_p, seen_p_next = _tie_ranks(tl.where(ink, p, -2.0), cut_p, seen_p)
            w = tl.where(ink & _member(p, rank_p, cut_p, miss_p) & (p >= thr_min), p, 0.0)
            c = run + tl.cumsum(w, 0)
            hit = tl.min(tl.where((c > target) & (offs < V), offs, V), 0)
            pick = tl.minimum(pick, hit)
            run += tl.sum(w, 0)
            seen_k = seen_k_next
            seen_p = seen_p_next
        tl.store(out_ptr + row * out_stride + j, tl.minimum(pick, last))


def triton_draw(
    logits: torch.Tensor,
    kind: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    min_p: np.ndarray,
    uniforms: np.ndarray,
) -> torch.Tensor:
    """The Triton twin of :func:`pie_backend_torch.sampling.draw` (same arguments and result)."""
    s, vocab = logits.shape
    width = uniforms.shape[1]
    out = torch.zeros((s, max(width, 1)), dtype=torch.int64, device=logits.device)
    if s == 0 or width == 0:
        return out[:, :width]
    dev = logits.device

    def on(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev, dtype)

    u = on(uniforms, torch.float64)
    draws = np.full(s, width, dtype=np.int32)  # rows with fewer draws ignore the rest
    x = logits.contiguous().float()
    _sample_kernel[(s,)](
        x,
        x.stride(0),
        on(kind, torch.int32),
        on(temperature, torch.float32),
        on(top_k, torch.int32),
        on(top_p, torch.float32),
        on(min_p, torch.float32),
        u,
        u.stride(0),
        on(draws, torch.int32),
        out,
        out.stride(0),
        vocab,
        BLOCK=min(1024, triton.next_power_of_2(vocab)),
    )
    return out
