"""Weights in the layout the torch forward wants: Q/K/V and gate/up fused, in the compute dtype
or quantised (see :mod:`pie_backend_torch.linear`).

The residual stream stays float32 (its norms' weights too: input, post-attention and final
norms); the norms inside a block (Q/K, sandwich) run in the compute dtype. The embedding table stays dense in the compute dtype (a
lookup reads a few rows); with tied embeddings the LM head is built from the same weights (and
shares the table when no packing or quantisation applies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from pie_core.backend_kit import ModelSpec, announce_step

from pie_backend_torch.linear import Linear, layer_tensors, quantise, rebuild_layer, refine
from pie_backend_torch.options import TorchConfig

__all__ = ["LayerWeights", "ModelWeights", "build_weights", "rebuild_weights"]

_Take = Callable[[str, tuple[int, ...]], torch.Tensor]


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer."""

    attn_norm: torch.Tensor  # [hidden] float32 (reads the float32 residual stream)
    qkv: Linear  # out: Q rows, then K, then V (bias included when the model has one)
    q_norm: torch.Tensor | None  # [head_dim]
    k_norm: torch.Tensor | None
    attn_output: Linear
    post_attention_norm: torch.Tensor | None
    ffn_norm: torch.Tensor
    gate_up: Linear  # out: gate rows first, then up
    ffn_down: Linear
    post_ffw_norm: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """All weights of one model."""

    embed: torch.Tensor | Linear  # [vocab, hidden] in the compute dtype, or (quant "fit") a layer with ``rows(ids)``
    lm_head: Linear
    output_norm: torch.Tensor
    layers: tuple[LayerWeights, ...]


class _Source:
    """Takes named arrays out of the loaded dict, checking shapes, and lays them out.

    Every tensor it returns is also put in ``record`` (when given) under a name that
    :class:`_Recorded` finds it by, so the result can be saved and rebuilt without the arrays.
    """

    def __init__(self, arrays: dict[str, np.ndarray], config: TorchConfig, record: dict[str, torch.Tensor] | None) -> None:
        self.arrays = arrays
        self.config = config
        self.record = record

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.arrays:
            raise ValueError(f"weight {name!r} is missing from the checkpoint")
        arr = np.asarray(self.arrays.pop(name))
        if arr.shape != shape:
            raise ValueError(f"weight {name!r} has shape {arr.shape}, expected {shape}")
        return torch.from_numpy(np.array(arr, dtype=np.float32))

    def _keep(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.record is not None:
            self.record[name] = tensor
        return tensor

    def vector(self, name: str, size: int) -> torch.Tensor:
        return self._keep(name, self.take(name, (size,)).to(self.config.device, self.config.dtype))

    def residual_norm(self, name: str, size: int) -> torch.Tensor:
        """Weights of a norm over the residual stream, which stays float32."""
        return self._keep(name, self.take(name, (size,)).to(self.config.device))

    def maybe_vector(self, name: str, size: int, present: bool) -> torch.Tensor | None:
        return self.vector(name, size) if present else None

    def embedding(self, weight: torch.Tensor) -> torch.Tensor | Linear:
        if self.config.quant == "fit":  # as precise as stored: the layer fit picks, read a row at a time
            return self.linear("embed", lambda: weight)
        return self._keep("embed", weight.to(self.config.device, self.config.dtype))

    def linear(
        self,
        name: str,
        weight: Callable[[], torch.Tensor],
        bias: Callable[[], torch.Tensor] | None = None,
        fine: bool = False,
    ) -> Linear:
        """The layer ``name``; ``fine``: its int8 activations in two steps under quant ``fit``
        (:func:`pie_backend_torch.linear.refine`; the store keeps the flag)."""
        cfg = self.config
        w = weight().to(cfg.device)
        b = None if bias is None else bias().to(cfg.device)
        layer = quantise(w, b, cfg.quant, cfg.dtype, cfg.quant_max_tokens, cfg.quant_large)
        if fine and cfg.quant == "fit":
            layer = refine(layer)
        if self.record is not None:
            self.record.update({f"{name}/{k}": v for k, v in layer_tensors(layer, w, cfg.dtype).items()})
        return layer


class _Recorded:
    """The same calls as :class:`_Source`, answered from tensors it recorded (a weights cache)."""

    def __init__(self, tensors: dict[str, torch.Tensor], config: TorchConfig) -> None:
        self.tensors = tensors
        self.config = config

    def _get(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise ValueError(f"tensor {name!r} is missing from the cached weights")
        return self.tensors[name].to(self.config.device)

    def vector(self, name: str, size: int) -> torch.Tensor:
        return self._get(name)

    residual_norm = vector

    def maybe_vector(self, name: str, size: int, present: bool) -> torch.Tensor | None:
        return self._get(name) if present else None

    def embedding(self, weight: torch.Tensor) -> torch.Tensor | Linear:
        if self.config.quant == "fit":
            return self.linear("embed", lambda: weight)
        return self._get("embed")

    def linear(
        self,
        name: str,
        weight: Callable[[], torch.Tensor],
        bias: Callable[[], torch.Tensor] | None = None,
        fine: bool = False,
    ) -> Linear:
        prefix = f"{name}/"  # ``fine`` as recorded (layer_tensors keeps the flag)
        parts = {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}
        return rebuild_layer(parts, self.config.dtype, self.config.quant_max_tokens)


def _layer(src: _Source | _Recorded, spec: ModelSpec, i: int, take: _Take) -> LayerWeights:
    h, hd = spec.hidden_size, spec.head_dim
    q_out, kv_out = spec.num_heads * hd, spec.num_kv_heads * hd
    inter = spec.intermediate_size
    p = f"blk.{i}."

    def qkv() -> torch.Tensor:
        return torch.cat([take(p + "attn_q.weight", (q_out, h)), take(p + "attn_k.weight", (kv_out, h)), take(p + "attn_v.weight", (kv_out, h))])

    def qkv_bias() -> torch.Tensor:
        return torch.cat([take(p + "attn_q.bias", (q_out,)), take(p + "attn_k.bias", (kv_out,)), take(p + "attn_v.bias", (kv_out,))])

    def gate_up() -> torch.Tensor:
        return torch.cat([take(p + "ffn_gate.weight", (inter, h)), take(p + "ffn_up.weight", (inter, h))])

    return LayerWeights(
        attn_norm=src.residual_norm(p + "attn_norm.weight", h),
        qkv=src.linear(p + "qkv", qkv, qkv_bias if spec.qkv_bias else None, fine=True),
        q_norm=src.maybe_vector(p + "attn_q_norm.weight", hd, spec.qk_norm),
        k_norm=src.maybe_vector(p + "attn_k_norm.weight", hd, spec.qk_norm),
        attn_output=src.linear(p + "attn_output", lambda: take(p + "attn_output.weight", (h, q_out))),
        post_attention_norm=src.maybe_vector(p + "post_attention_norm.weight", h, spec.sandwich_norm),
        ffn_norm=src.residual_norm(p + "ffn_norm.weight", h),
        gate_up=src.linear(p + "gate_up", gate_up),
        ffn_down=src.linear(p + "ffn_down", lambda: take(p + "ffn_down.weight", (h, inter)), fine=True),
        post_ffw_norm=src.maybe_vector(p + "post_ffw_norm.weight", h, spec.sandwich_norm),
    )


def build_weights(
    spec: ModelSpec,
    weights: Iterable[tuple[str, np.ndarray]],
    config: TorchConfig,
    record: dict[str, torch.Tensor] | None = None,
) -> ModelWeights:
    """Consume ``(canonical name, array)`` pairs and lay them out for the forward.

    Args:
        record: When given, receives every tensor of the result by name (for
            :func:`rebuild_weights`; dense layers add their unpacked weight).

    Raises:
        ValueError: A weight is missing, misshapen, or not expected by ``spec``.
    """
    src = _Source(dict(weights), config, record)
    vocab, h = spec.vocab_size, spec.hidden_size
    what = f"torch backend: laying out the weights (quant {config.quant}, {config.dtype_name}"
    what += "; kept in the weights cache for next time)" if record is not None else ")"
    announce_step(f"{what}: embedding and output head")
    embed32 = src.take("token_embd.weight", (vocab, h))
    embed = src.embedding(embed32)
    if spec.tie_embeddings:
        src.arrays.pop("output.weight", None)  # some checkpoints store the tied copy anyway
        lm_head = embed if not isinstance(embed, torch.Tensor) else src.linear("lm_head", lambda: embed32)
    else:
        lm_head = src.linear("lm_head", lambda: src.take("output.weight", (vocab, h)))
    del embed32
    output_norm = src.residual_norm("output_norm.weight", h)
    layers = []
    for i in range(spec.num_layers):
        announce_step(f"{what}: layer {i + 1}/{spec.num_layers}")
        layers.append(_layer(src, spec, i, src.take))
    if src.arrays:
        extra = ", ".join(sorted(src.arrays)[:5])
        raise ValueError(f"unexpected weights for a {spec.arch} model: {extra}")
    return ModelWeights(embed=embed, lm_head=lm_head, output_norm=output_norm, layers=tuple(layers))


def rebuild_weights(spec: ModelSpec, tensors: dict[str, torch.Tensor], config: TorchConfig) -> ModelWeights:
    """The weights that :func:`build_weights` recorded into ``tensors``, without the checkpoint.

    Raises:
        ValueError: A tensor is missing (the record is of another model or layout).
    """
    src = _Recorded(tensors, config)

    def unused(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        raise AssertionError("cached weights need no checkpoint tensor")

    h = spec.hidden_size
    embed = src.embedding(torch.empty(0))
    tied = spec.tie_embeddings and not isinstance(embed, torch.Tensor)
    return ModelWeights(
        embed=embed,
        lm_head=embed if tied else src.linear("lm_head", lambda: torch.empty(0)),
        output_norm=src.residual_norm("output_norm.weight", h),
        layers=tuple(_layer(src, spec, i, unused) for i in range(spec.num_layers)),
    )
