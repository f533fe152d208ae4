"""The decoder-only transformer forward over one flat batch, in torch.

Activations are token-major (``[tokens, features]``); the residual stream is float32 whatever the
compute dtype (each block's output is added to it), and block inputs are cast after the norm.
Dense layers run over all N tokens of the
batch at once (prefill and decode rows mixed); Q and K heads are rotated together; attention is
the torch path of :mod:`pie_backend_torch.attention` or the Triton kernels. Logits are computed
only for the rows the batch samples or probes. A batch running adapters adds their LoRA deltas to
the four projections' outputs (:class:`~pie_backend_torch.lora_step.LoraStep`).

Under tensor parallelism (:mod:`pie_backend_torch.tp_shard`) each rank runs this same forward on
its slice (its heads, its part of the MLP) and ``reduce`` sums the attention-out and MLP-down
products over the ranks; with one rank ``reduce`` is None and nothing else differs.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from pie_core.backend_kit import ForwardBatch, ModelSpec, write_slots

from pie_backend_torch.attention import attend
from pie_backend_torch.kv_cache import KvCache
from pie_backend_torch.layout import BatchPlan, plan_batch
from pie_backend_torch.lora_step import LoraStep
from pie_backend_torch.lora_weights import ATTN_OUTPUT, FFN_DOWN, GATE_UP, QKV
from pie_backend_torch.options import TorchConfig
from pie_backend_torch.rope import RopeTables, Rotation, apply_rotation
from pie_backend_torch.weights import LayerWeights, ModelWeights

__all__ = ["Transformer", "activation"]


def activation(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP's gate activation by name.

    Raises:
        ValueError: Unknown kind.
    """
    if kind == "silu":
        return F.silu
    if kind == "gelu_tanh":
        return lambda g: F.gelu(g, approximate="tanh")
    raise ValueError(f"unsupported activation {kind!r}; expected 'silu' or 'gelu_tanh'")


class Transformer:
    """Runs one model's forward against its KV cache."""

    def __init__(
        self,
        spec: ModelSpec,
        weights: ModelWeights,
        cache: KvCache,
        config: TorchConfig,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.act = activation(spec.hidden_act)
        self.reduce = reduce
        """Sums a row-parallel product over the tensor-parallel ranks (None: one rank)."""
        self.spec = spec
        self.weights = weights
        self.cache = cache
        self.config = config
        self.linear_dtype = torch.float32 if config.quant in ("q4", "q8", "w8a8", "fit") else config.dtype
        """What the linear layers take: q4, q8, fit and w8a8 quantise float32 activations themselves."""
        self.rope = RopeTables(spec, config.device)
        self.window = spec.sliding_window if any(spec.is_sliding(i) for i in range(spec.num_layers)) else None
        self.sliding = tuple(spec.is_sliding(i) and self.window is not None for i in range(spec.num_layers))
        self.triton: Any = None
        if config.kernels == "triton":
            from pie_backend_torch.triton_kernels.ops import TritonAttention

            self.triton = TritonAttention(spec, cache)

    def forward(
        self,
        batch: ForwardBatch,
        rows: np.ndarray,
        hidden_rows: np.ndarray | None = None,
        lora: LoraStep | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Write the batch's K/V, run every layer, and return what the requested rows need.

        Args:
            batch: A checked batch.
            rows: Token indices whose logits are returned.
            hidden_rows: Token indices whose final hidden state (after the final norm) is
                returned (EMBEDDING probes); None or empty for none.
            lora: The batch's adapter deltas, or None when no request runs an adapter.

        Returns:
            float32 ``[len(rows), vocab]`` logits and float32 ``[len(hidden_rows), hidden]``
            hidden states (None when none were asked for), on the device.
        """
        device = self.config.device
        index = write_slots(batch, self.cache.page_size)
        self.cache.write_positions(index, batch.positions)
        plan: Any
        if self.triton is not None:
            plan = self.triton.plan(batch, index, self.window)
        else:
            plan = plan_batch(batch, index, self.cache.positions, self.cache.page_size, self.window, device)
        tables = self.triton is None  # the Triton kernel reads cos/sin only
        rotations = {False: self.rope.rotation(batch.positions, False, tables)}
        if self.window is not None:
            rotations[True] = self.rope.rotation(batch.positions, True, tables)
        ids = torch.from_numpy(batch.token_ids.astype(np.int64)).to(device)
        return self.head(self.layers(ids, rotations, plan, lora), rows, hidden_rows)

    def layers(
        self, ids: torch.Tensor, rotations: dict[bool, Rotation], plan: Any, lora: LoraStep | None = None
    ) -> torch.Tensor:
        """Embed ``ids`` and run every decoder layer (K/V written, attention read through ``plan``).

        Only device work: no host transfer happens here, so CUDA graphs can capture it.
        """
        embed = self.weights.embed
        x = F.embedding(ids, embed).float() if isinstance(embed, torch.Tensor) else embed.rows(ids)
        if self.spec.embed_scale != 1.0:
            x = x * self.spec.embed_scale
        for i, lw in enumerate(self.weights.layers):
            x = self._layer(i, lw, x, rotations[self.sliding[i]], plan, lora)
        return x

    def head(
        self, x: torch.Tensor, rows: np.ndarray, hidden_rows: np.ndarray | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final norm, then logits of ``rows`` (and hidden states of ``hidden_rows``)."""
        spec, w = self.spec, self.weights
        hidden = None
        if hidden_rows is not None and hidden_rows.size:
            sel = torch.from_numpy(hidden_rows).to(x.device)
            hidden = F.rms_norm(x.index_select(0, sel), (spec.hidden_size,), w.output_norm, spec.rms_norm_eps).float()
        if rows.size == 0:
            return torch.zeros((0, spec.vocab_size), dtype=torch.float32, device=x.device), hidden
        if len(rows) != x.shape[0]:
            x = x.index_select(0, torch.from_numpy(rows).to(x.device))
        h = F.rms_norm(x, (spec.hidden_size,), w.output_norm, spec.rms_norm_eps)
        logits = w.lm_head(h.to(self.linear_dtype)).float()
        if spec.final_softcap is not None:
            logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
        return logits, hidden

    def _layer(
        self, i: int, lw: LayerWeights, x: torch.Tensor, rot: Rotation, plan: Any, lora: LoraStep | None
    ) -> torch.Tensor:
        spec = self.spec
        eps, dtype = spec.rms_norm_eps, self.linear_dtype
        normed = F.rms_norm(x, (spec.hidden_size,), lw.attn_norm, eps)
        qkv = lw.qkv(normed.to(dtype))
        if lora is not None:
            lora.add(i, QKV, normed, qkv)  # float32 input: no cast back for the deltas
        if self.triton is not None:
            q = self.triton.rope_and_write(i, qkv, lw.q_norm, lw.k_norm, eps, rot, plan)
            ctx = self.triton.attend(i, q, plan, self.sliding[i], spec.attn_softcap)
        else:
            ctx = self._attention(i, lw, qkv, rot, plan)
        o = lw.attn_output(ctx)
        tp = self.reduce is not None
        if lora is not None and (lw.post_attention_norm is not None or tp):
            lora.add(i, ATTN_OUTPUT, ctx, o)  # under tp a partial sum, like ``o``: before the all-reduce
        if self.reduce is not None:
            o = self.reduce(o)
        if lw.post_attention_norm is not None:
            o = F.rms_norm(o, (spec.hidden_size,), lw.post_attention_norm, eps)
        x = x + o
        if lora is not None and lw.post_attention_norm is None and not tp:
            lora.add(i, ATTN_OUTPUT, ctx, x)  # straight into the float32 residual: no cast, cheaper adds
        normed = F.rms_norm(x, (spec.hidden_size,), lw.ffn_norm, eps)
        gu = lw.gate_up(normed.to(dtype))
        if lora is not None:
            lora.add(i, GATE_UP, normed, gu)
        inter = spec.intermediate_size
        act = self.act(gu[:, :inter]) * gu[:, inter:]
        f = lw.ffn_down(act)
        if lora is not None and (lw.post_ffw_norm is not None or tp):
            lora.add(i, FFN_DOWN, act, f)
        if self.reduce is not None:
            f = self.reduce(f)
        if lw.post_ffw_norm is not None:
            f = F.rms_norm(f, (spec.hidden_size,), lw.post_ffw_norm, eps)
        x = x + f
        if lora is not None and lw.post_ffw_norm is None and not tp:
            lora.add(i, FFN_DOWN, act, x)
        return x

    def _attention(self, i: int, lw: LayerWeights, qkv: torch.Tensor, rot: Rotation, plan: BatchPlan) -> torch.Tensor:
        spec = self.spec
        n, hd = qkv.shape[0], spec.head_dim
        heads, kvh = spec.num_heads, spec.num_kv_heads
        qk = qkv[:, : (heads + kvh) * hd].view(n, heads + kvh, hd)
        v = qkv[:, (heads + kvh) * hd :].view(n, kvh, hd)
        if lw.q_norm is not None and lw.k_norm is not None:
            qk = torch.cat(
                [
                    F.rms_norm(qk[:, :heads], (hd,), lw.q_norm, spec.rms_norm_eps),
                    F.rms_norm(qk[:, heads:], (hd,), lw.k_norm, spec.rms_norm_eps),
                ],
                dim=1,
            )
        qk = apply_rotation(qk, rot)
        self.cache.write(i, plan.write_index, qk[:, heads:], v)
        return attend(qk[:, :heads], self.cache, i, plan, self.sliding[i], spec.attn_softcap)
