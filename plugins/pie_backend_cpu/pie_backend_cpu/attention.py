"""Grouped-query attention over paged K/V, vectorised per request (blocks) or per decode group.

Queries arrive feature-major as ``[heads, head_dim, N]`` (already scaled by the softmax scale)
and the result is ``[heads * head_dim, N]``. Query head ``h`` reads KV head ``h // (heads // kv_heads)``, as
Hugging Face's ``repeat_kv`` does.
"""

from __future__ import annotations

import numpy as np

from pie_backend_cpu.layout import BatchLayout
from pie_backend_cpu.kv_store import KvPool

__all__ = ["attend", "SCORE_BLOCK_ELEMENTS"]

SCORE_BLOCK_ELEMENTS = 1 << 24
"""Upper bound on attention scores materialised at once (64 MiB of float32); long prefills are
processed in query chunks under it."""


def _bias(allowed: np.ndarray) -> np.ndarray:
    """Additive mask: 0 where allowed, -inf elsewhere."""
    return np.where(allowed, np.float32(0), np.float32(-np.inf))


def _softmax_weighted(scores: np.ndarray, bias: np.ndarray, softcap: float | None) -> np.ndarray:
    """Masked softmax over the last axis, in place; rows with no allowed key get all-zero weights.

    Args:
        scores: float32 scores, overwritten with the weights.
        bias: Additive mask broadcasting against ``scores`` (see :func:`_bias`).
        softcap: ``cap * tanh(scores / cap)`` before masking, or None.
    """
    if softcap is not None:
        scores /= np.float32(softcap)
        np.tanh(scores, out=scores)
        scores *= np.float32(softcap)
    scores += bias
    peak = scores.max(axis=-1, keepdims=True)
    peak[~np.isfinite(peak)] = 0
    scores -= peak
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    total[total == 0] = 1
    scores /= total
    return scores


def _attend_block(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, softcap: float | None
) -> np.ndarray:
    """One request: q ``[kvh, g, d, n]``, k/v ``[L, kvh, d]``, allowed ``[n, L]`` -> ``[kvh*g*d, n]``."""
    kvh, g, d, n = q.shape
    length = k.shape[0]
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))  # [kvh, d, L]; contiguous keeps BLAS on
    vt = np.ascontiguousarray(v.transpose(1, 0, 2))  # [kvh, L, d]
    out = np.empty((kvh, g, d, n), dtype=np.float32)
    chunk = max(1, SCORE_BLOCK_ELEMENTS // max(1, kvh * g * length))
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        qc = np.ascontiguousarray(q[..., a:b].transpose(0, 1, 3, 2)).reshape(kvh, g * (b - a), d)
        scores = np.matmul(qc, kt).reshape(kvh, g, b - a, length)
        w = _softmax_weighted(scores, _bias(allowed[a:b]), softcap).reshape(kvh, g * (b - a), length)
        ctx = np.matmul(w, vt).reshape(kvh, g, b - a, d)
        out[..., a:b] = ctx.transpose(0, 1, 3, 2)
    return out.reshape(kvh * g * d, n)


def _attend_decode(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, softcap: float | None
) -> np.ndarray:
    """G single-token requests: q ``[G, kvh, g, d]``, k/v ``[G, L, kvh, d]``, allowed ``[G, L]``
    -> ``[G, kvh*g*d]``."""
    G, kvh, g, d = q.shape
    kt = k.transpose(0, 2, 3, 1)  # [G, kvh, d, L]
    vt = v.transpose(0, 2, 1, 3)  # [G, kvh, L, d]
    scores = np.matmul(q, kt)  # [G, kvh, g, L]
    w = _softmax_weighted(scores, _bias(allowed)[:, None, None, :], softcap)
    return np.matmul(w, vt).reshape(G, kvh * g * d)


def attend(
    q: np.ndarray,
    pool: KvPool,
    layer: int,
    layout: BatchLayout,
    sliding: bool,
    softcap: float | None,
) -> np.ndarray:
    """Attention of every input token over its request's KV pages, for one layer.

    Args:
        q: ``[heads, head_dim, N]`` float32 queries, RoPE applied and pre-scaled.
        pool: The device pool (this pass's K/V already written).
        layer: Layer index.
        layout: The batch layout.
        sliding: Whether this layer uses the sliding-window masks.
        softcap: Attention logit soft-capping, or None.

    Returns:
        ``[heads * head_dim, N]`` float32 attention outputs.
    """
    heads, d, n = q.shape
    kv_heads = pool.k.shape[3]
    g = heads // kv_heads
    qg = q.reshape(kv_heads, g, d, n)
    out = np.empty((heads * d, n), dtype=np.float32)
    k_layer, v_layer = pool.k[layer], pool.v[layer]
    for grp in layout.decode_groups:
        members = len(grp.tokens)
        k = k_layer[grp.table].reshape(members, -1, kv_heads, d)
        v = v_layer[grp.table].reshape(members, -1, kv_heads, d)
        allowed = grp.allowed_sliding if sliding and grp.allowed_sliding is not None else grp.allowed
        qd = np.ascontiguousarray(qg[..., grp.tokens].transpose(3, 0, 1, 2))
        out[:, grp.tokens] = _attend_decode(qd, k, v, allowed, softcap).T
    for blk in layout.blocks:
        k = k_layer[blk.pages].reshape(-1, kv_heads, d)[: blk.kv_len]
        v = v_layer[blk.pages].reshape(-1, kv_heads, d)[: blk.kv_len]
        allowed = blk.allowed_sliding if sliding and blk.allowed_sliding is not None else blk.allowed
        out[:, blk.start : blk.stop] = _attend_block(qg[..., blk.start : blk.stop], k, v, allowed, softcap)
    return out
