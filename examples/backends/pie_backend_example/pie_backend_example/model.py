"""The example backend's math: a plain float32 NumPy decoder over a paged KV cache.

Written to be read, not to be fast: activations are token-major (``[tokens, features]``),
every projection is ``x @ W.T`` on the checkpoint's ``[out, in]`` matrices, and attention runs
one request at a time. It covers every architecture a ``ModelSpec`` describes (qwen2, llama,
qwen3, gemma3): QKV bias, Q/K norms, sandwich norms, gelu, an embedding scale, sliding windows
and soft-caps. This is the file a real backend replaces with its kernels.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from pie_core.backend_kit import ForwardBatch, ModelSpec, kv_lengths, layer_frequencies, write_slots

__all__ = ["Model"]


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps)) * weight


def _act(gate: np.ndarray, kind: str) -> np.ndarray:
    if kind == "silu":
        with np.errstate(over="ignore"):
            return gate / (1.0 + np.exp(-gate))
    c = np.float32(math.sqrt(2.0 / math.pi))  # gelu_tanh
    return 0.5 * gate * (1.0 + np.tanh(c * (gate + np.float32(0.044715) * gate**3)))


def _rope(x: np.ndarray, inv_freq: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rotate ``x`` ``[N, heads, head_dim]`` in the rotate-half layout every reader normalises to."""
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Model:
    """One loaded model and its KV pages (every layer's K and V, and each slot's position)."""

    def __init__(self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], num_pages: int,
                 page_size: int) -> None:
        """Take the weights and allocate the pages.

        Raises:
            ValueError: A weight is missing, misshapen or unexpected, or the activation is unknown.
        """
        if spec.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unsupported activation {spec.hidden_act!r}; expected 'silu' or 'gelu_tanh'")
        self.spec, self.page_size = spec, page_size
        self.w = {name: np.asarray(a, dtype=np.float32) for name, a in weights}
        self._check_weights()
        slots = num_pages * page_size
        shape = (spec.num_layers, slots, spec.num_kv_heads, spec.head_dim)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.pos = np.zeros(slots, np.int64)
        self.full_freq, self.sliding_freq = layer_frequencies(spec)

    def _expected(self) -> dict[str, tuple[int, ...]]:
        s = self.spec
        h, q, kv, inter = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (s.vocab_size, h), "output_norm.weight": (h,)}
        if not s.tie_embeddings:
            shapes["output.weight"] = (s.vocab_size, h)
        for i in range(s.num_layers):
            p = f"blk.{i}."
            shapes.update({p + "attn_norm.weight": (h,), p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h),
                           p + "attn_v.weight": (kv, h), p + "attn_output.weight": (h, q), p + "ffn_norm.weight": (h,),
                           p + "ffn_gate.weight": (inter, h), p + "ffn_up.weight": (inter, h),
                           p + "ffn_down.weight": (h, inter)})
            if s.qkv_bias:
                shapes.update({p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)})
            if s.qk_norm:
                shapes.update({p + "attn_q_norm.weight": (s.head_dim,), p + "attn_k_norm.weight": (s.head_dim,)})
            if s.sandwich_norm:
                shapes.update({p + "post_attention_norm.weight": (h,), p + "post_ffw_norm.weight": (h,)})
        return shapes

    def _check_weights(self) -> None:
        expected = self._expected()
        if self.spec.tie_embeddings:
            self.w.pop("output.weight", None)  # some checkpoints store the tied copy anyway
        for name, shape in expected.items():
            if name not in self.w:
                raise ValueError(f"weight {name!r} is missing from the checkpoint")
            if self.w[name].shape != shape:
                raise ValueError(f"weight {name!r} has shape {self.w[name].shape}, expected {shape}")
        if extra := sorted(set(self.w) - set(expected)):
            raise ValueError(f"unexpected weights for a {self.spec.arch} model: {', '.join(extra[:5])}")

    def forward(self, batch: ForwardBatch, rows: np.ndarray) -> np.ndarray:
        """Write the batch's K/V, run every layer, and return float32 ``[len(rows), vocab]`` logits."""
        s, w = self.spec, self.w
        slots = write_slots(batch, self.page_size)  # flat pool slot of each token's K/V
        self.pos[slots] = batch.positions
        keys = self._key_slots(batch)
        x = w["token_embd.weight"][batch.token_ids] * np.float32(s.embed_scale)
        for i in range(s.num_layers):
            x = self._layer(i, x, batch, slots, keys)
        h = _rms_norm(x[rows], w["output_norm.weight"], s.rms_norm_eps)
        logits = h @ w["token_embd.weight" if s.tie_embeddings else "output.weight"].T
        if s.final_softcap is not None:
            logits = np.tanh(logits / np.float32(s.final_softcap)) * np.float32(s.final_softcap)
        return np.ascontiguousarray(logits, dtype=np.float32)

    def _key_slots(self, batch: ForwardBatch) -> list[np.ndarray]:
        """Each request's KV as flat pool slots, in sequence order."""
        lengths = kv_lengths(batch, self.page_size)
        out = []
        for r in range(batch.num_requests):
            pages = batch.kv_page_indices[batch.kv_page_indptr[r] : batch.kv_page_indptr[r + 1]].astype(np.int64)
            flat = (pages[:, None] * self.page_size + np.arange(self.page_size)).ravel()
            out.append(flat[: lengths[r]])
        return out

    def _layer(self, i: int, x: np.ndarray, batch: ForwardBatch, slots: np.ndarray,
               keys: list[np.ndarray]) -> np.ndarray:
        s, p, n = self.spec, f"blk.{i}.", x.shape[0]
        w = lambda name: self.w[p + name]  # noqa: E731
        heads, kvh, hd, eps = s.num_heads, s.num_kv_heads, s.head_dim, s.rms_norm_eps
        h = _rms_norm(x, w("attn_norm.weight"), eps)
        q, k, v = (h @ w(f"attn_{t}.weight").T for t in "qkv")
        if s.qkv_bias:
            q, k, v = q + w("attn_q.bias"), k + w("attn_k.bias"), v + w("attn_v.bias")
        q, k, v = q.reshape(n, heads, hd), k.reshape(n, kvh, hd), v.reshape(n, kvh, hd)
        if s.qk_norm:
            q, k = _rms_norm(q, w("attn_q_norm.weight"), eps), _rms_norm(k, w("attn_k_norm.weight"), eps)
        sliding = s.is_sliding(i)
        freq = self.sliding_freq if sliding else self.full_freq
        q, k = _rope(q, freq, batch.positions), _rope(k, freq, batch.positions)
        self.k[i, slots], self.v[i, slots] = k, v
        o = self._attention(i, q * np.float32(s.scale), batch, keys, sliding).reshape(n, heads * hd)
        o = o @ w("attn_output.weight").T
        if s.sandwich_norm:
            o = _rms_norm(o, w("post_attention_norm.weight"), eps)
        x = x + o
        h = _rms_norm(x, w("ffn_norm.weight"), eps)
        f = (_act(h @ w("ffn_gate.weight").T, s.hidden_act) * (h @ w("ffn_up.weight").T)) @ w("ffn_down.weight").T
        if s.sandwich_norm:
            f = _rms_norm(f, w("post_ffw_norm.weight"), eps)
        return x + f

    def _attention(self, layer: int, q: np.ndarray, batch: ForwardBatch, keys: list[np.ndarray],
                   sliding: bool) -> np.ndarray:
        """Causal attention by slot: a token sees its request's slots up to its own write slot
        (and, on sliding layers, only keys less than ``sliding_window`` positions back)."""
        s = self.spec
        group = s.num_heads // s.num_kv_heads
        out = np.zeros_like(q)
        for r in range(batch.num_requests):
            a, b = int(batch.qo_indptr[r]), int(batch.qo_indptr[r + 1])
            kv = keys[r]
            k = np.repeat(self.k[layer, kv], group, axis=1)  # [L, heads, hd], like transformers' repeat_kv
            v = np.repeat(self.v[layer, kv], group, axis=1)
            scores = np.einsum("nhd,lhd->hnl", q[a:b], k)
            if s.attn_softcap is not None:
                scores = np.tanh(scores / np.float32(s.attn_softcap)) * np.float32(s.attn_softcap)
            allowed = np.arange(len(kv))[None, :] <= batch.kv_write_slots[a:b, None]
            if sliding and s.sliding_window is not None:
                allowed &= self.pos[kv][None, :] > batch.positions[a:b, None] - s.sliding_window
            scores = np.where(allowed[None], scores, -np.inf)
            peak = scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores - np.where(np.isfinite(peak), peak, 0))
            weights /= np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(1e-30))
            out[a:b] = np.einsum("hnl,lhd->nhd", weights, v)
        return out

    def copy_pages(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole pages (every layer's K and V, and the slot positions).

        Raises:
            ValueError: Lengths differ, or an id is outside the pool.
        """
        pages = self.pos.shape[0] // self.page_size
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        if len(src) != len(dst):
            raise ValueError(f"copy_pages needs as many destinations as sources, got {len(src)} and {len(dst)}")
        for name, ids in (("source", src), ("destination", dst)):
            if ids.size and (ids.min() < 0 or ids.max() >= pages):
                raise ValueError(f"{name} page id {int(ids[(ids < 0) | (ids >= pages)][0])} is out of range [0, {pages})")
        ps = self.page_size
        from_slots = (src[:, None] * ps + np.arange(ps)).ravel()
        to_slots = (dst[:, None] * ps + np.arange(ps)).ravel()
        self.k[:, to_slots], self.v[:, to_slots] = self.k[:, from_slots], self.v[:, from_slots]
        self.pos[to_slots] = self.pos[from_slots]
