"""The decoder-only transformer forward over one flat batch, in float32 numpy.

Dense layers run as one GEMM over all N tokens of the batch (prefill and decode rows mixed);
attention is vectorised per request or per decode group (see ``attention``). Logits are only
computed for the rows the batch samples or probes, final hidden states only for the rows it
probes for embeddings. Requests running an adapter add its LoRA deltas to the four fused
projections, one low-rank product per ``(adapter, zo seed)`` group (see ``lora_deltas``).
"""

from __future__ import annotations

import math

import numpy as np

from pie_core.backend_kit import ForwardBatch, ModelSpec

from pie_backend_cpu.attention import attend
from pie_backend_cpu.kv_store import KvStore
from pie_backend_cpu.layout import BatchLayout, build_layout, write_targets
from pie_backend_cpu.lora_deltas import TokenGroup, add_deltas
from pie_backend_cpu.rope import RopeTables, apply_rope
from pie_backend_cpu.weights import LayerWeights, ModelWeights

__all__ = ["Transformer", "rms_norm"]

_GELU_C = np.float32(math.sqrt(2.0 / math.pi))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, axis: int = 0) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * weight`` over ``axis`` (features; tokens are the last axis).

    ``weight`` must broadcast against ``x`` (a column ``[features, 1]`` for ``axis=0``).
    """
    mean_sq = np.mean(np.square(x), axis=axis, keepdims=True)
    return x * (1.0 / np.sqrt(mean_sq + np.float32(eps))) * weight


def _activation(gate: np.ndarray, kind: str) -> np.ndarray:
    if kind == "silu":
        with np.errstate(over="ignore"):
            return gate / (1.0 + np.exp(-gate))
    if kind == "gelu_tanh":
        return 0.5 * gate * (1.0 + np.tanh(_GELU_C * (gate + np.float32(0.044715) * gate**3)))
    raise ValueError(f"unsupported activation {kind!r}; expected 'silu' or 'gelu_tanh'")


def _transpose(a: np.ndarray, block: int = 256) -> np.ndarray:
    """C-contiguous ``a.T`` of a tall ``[V, U]`` array, copied in row blocks that stay in cache
    (several times faster than one strided copy when ``V`` is a vocabulary)."""
    out = np.empty((a.shape[1], a.shape[0]), dtype=a.dtype)
    for start in range(0, a.shape[0], block):
        out[:, start : start + block] = a[start : start + block].T
    return out


class Transformer:
    """Runs one model's forward against its KV store.

    Activations are feature-major, ``[features, tokens]``, so every projection is ``W @ X``.
    """

    def __init__(self, spec: ModelSpec, weights: ModelWeights, store: KvStore) -> None:
        _activation(np.zeros(1, dtype=np.float32), spec.hidden_act)  # reject unknown kinds at load
        self.spec = spec
        self.weights = weights
        self.store = store
        self.rope = RopeTables(spec)
        self.window = spec.sliding_window if any(spec.is_sliding(i) for i in range(spec.num_layers)) else None

    def forward(
        self,
        batch: ForwardBatch,
        rows: np.ndarray,
        hidden_rows: np.ndarray | None = None,
        adapters: tuple[TokenGroup, ...] = (),
    ) -> tuple[np.ndarray, np.ndarray]:
        """Write the batch's K/V, run every layer, and return what the requested rows need.

        Args:
            batch: A checked batch.
            rows: Token indices (into the batch's N tokens) whose logits are returned.
            hidden_rows: Token indices whose final hidden state (after the final norm) is
                returned (EMBEDDING probes); None for none.
            adapters: The batch's adapter groups (``AdapterStore.groups``); empty for none.

        Returns:
            float32 ``[len(rows), vocab]`` logits and float32 ``[len(hidden_rows), hidden]``
            hidden states, both C-contiguous.
        """
        spec = self.spec
        n = batch.num_tokens
        layout = self._layout(batch)
        x = np.ascontiguousarray(self.weights.embed[batch.token_ids].T)
        if spec.embed_scale != 1.0:
            x *= np.float32(spec.embed_scale)
        tables = {False: self.rope.cos_sin(batch.positions, False)}
        if self.window is not None:
            tables[True] = self.rope.cos_sin(batch.positions, True)
        for i, lw in enumerate(self.weights.layers):
            sliding = spec.is_sliding(i)
            cos, sin = tables[sliding and self.window is not None]
            x = self._layer(i, lw, x, cos, sin, layout, sliding, adapters)
        hidden = np.zeros((0, spec.hidden_size), dtype=np.float32)
        if hidden_rows is not None and hidden_rows.size:
            hidden = _transpose(rms_norm(x[:, hidden_rows], self.weights.output_norm, spec.rms_norm_eps))
        if rows.size == 0:
            return np.zeros((0, spec.vocab_size), dtype=np.float32), hidden
        h = rms_norm(x[:, rows] if len(rows) != n else x, self.weights.output_norm, spec.rms_norm_eps)
        logits = self.weights.lm_head @ h
        if spec.final_softcap is not None:
            cap = np.float32(spec.final_softcap)
            logits = np.tanh(logits / cap) * cap
        return _transpose(logits), hidden

    def _layout(self, batch: ForwardBatch) -> BatchLayout:
        ps = self.store.page_size
        targets = write_targets(batch, ps)
        self.store.write_positions(targets[0], targets[1], batch.positions)
        return build_layout(batch, targets, self.store.device.pos, ps, self.window)

    def _layer(
        self,
        i: int,
        lw: LayerWeights,
        x: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        layout: BatchLayout,
        sliding: bool,
        adapters: tuple[TokenGroup, ...],
    ) -> np.ndarray:
        spec = self.spec
        n = x.shape[1]
        eps = spec.rms_norm_eps
        hd, heads, kvh = spec.head_dim, spec.num_heads, spec.num_kv_heads
        h = rms_norm(x, lw.attn_norm, eps)
        qkv = lw.qkv @ h
        if adapters:
            add_deltas(qkv, h, adapters, i, "qkv")
        if lw.qkv_bias is not None:
            qkv += lw.qkv_bias
        q = qkv[: heads * hd].reshape(heads, hd, n)
        k = qkv[heads * hd : (heads + kvh) * hd].reshape(kvh, hd, n)
        v = qkv[(heads + kvh) * hd :].reshape(kvh, hd, n)
        if lw.q_norm is not None and lw.k_norm is not None:
            q = rms_norm(q, lw.q_norm, eps, axis=1)
            k = rms_norm(k, lw.k_norm, eps, axis=1)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        self.store.write(
            i, layout.write_pages, layout.write_offsets, k.transpose(2, 0, 1), v.transpose(2, 0, 1)
        )
        q *= np.float32(spec.scale)
        ctx = attend(q, self.store.device, i, layout, sliding, spec.attn_softcap)
        o = lw.attn_output @ ctx
        if adapters:
            add_deltas(o, ctx, adapters, i, "attn_output")
        if lw.post_attention_norm is not None:
            o = rms_norm(o, lw.post_attention_norm, eps)
        x = x + o
        h = rms_norm(x, lw.ffn_norm, eps)
        gu = lw.gate_up @ h
        if adapters:
            add_deltas(gu, h, adapters, i, "gate_up")
        inter = spec.intermediate_size
        f = _activation(gu[:inter], spec.hidden_act)
        f *= gu[inter:]
        down = lw.ffn_down @ f
        if adapters:
            add_deltas(down, f, adapters, i, "ffn_down")
        if lw.post_ffw_norm is not None:
            down = rms_norm(down, lw.post_ffw_norm, eps)
        return x + down
