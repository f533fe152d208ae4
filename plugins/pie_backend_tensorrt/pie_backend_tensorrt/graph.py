"""The model as one ONNX graph: embeddings, every layer, paged attention, the output head.

The graph is built from the :class:`ModelSpec` and its float32 weights with plain ONNX ops
(opset 21), so TensorRT, CUDA and the CPU execution providers all run the same file. Activations
are token-major ``[N, features]``.

The KV cache lives in graph inputs ``k_cache.{i}`` / ``v_cache.{i}`` (``[C, kv_heads,
head_dim]``, slot = page * page_size + offset) that the graph updates with ``ScatterND`` into
outputs ``k_cache_out.{i}`` / ``v_cache_out.{i}``; the runner binds each output to its input's
buffer, so the update happens in place. Attention then gathers each request's slots from the
updated cache.

Attention runs in two groups, each padded to its own shape so a prefill never pads the decode
rows to its length: group ``a`` (requests with one token and no custom mask) and group ``b``
(the rest). For group ``g`` of ``R`` requests, at most ``M`` query tokens and ``T`` key slots:

    q_index_g [R, M]       token of each query row (padding: any valid token)
    kv_slots_g [R, T]      cache slot of each key (padding: any valid slot)
    bias_g [R, M, T]       additive mask, 0 = attend, a large negative = not (and for sliding
                           layers ``bias_local_g``)
    row_valid_g [R, M, 1]  1 for a real query row with some key to attend, else 0 (its output is 0;
                           ``row_valid_local_g`` for sliding layers)

``out_index [N]`` picks each token's row from the concatenated ``[R_a*M_a + R_b*M_b]`` outputs.
The other inputs: ``input_ids [N]``, ``write_slots [N, 1]``, ``cos``/``sin`` ``[N, head_dim/2]``
(and ``cos_local``/``sin_local``), ``logit_index [S]`` and ``hidden_index [E]``. Outputs:
``logits [S, vocab]`` and ``hidden [E, hidden]`` (after the final norm), both float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pie_core.backend_kit import ModelSpec

__all__ = ["GRAPH_VERSION", "OPSET", "build_graph", "cache_names", "mask_value", "GROUPS"]

GRAPH_VERSION = 2
"""Bump when the graph changes, so cached exports are rebuilt."""
OPSET = 21
GROUPS = ("a", "b")
_ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def mask_value(dtype: str) -> float:
    """The additive bias of a masked key: finite, so a row with nothing to attend stays NaN-free."""
    return -65000.0 if dtype == "float16" else -1e30


def cache_names(layer: int) -> tuple[str, str, str, str]:
    """Input and output names of one layer's cache: ``k_in, v_in, k_out, v_out``."""
    return f"k_cache.{layer}", f"v_cache.{layer}", f"k_cache_out.{layer}", f"v_cache_out.{layer}"


@dataclass(frozen=True, slots=True)
class _Layer:
    attn_norm: np.ndarray
    qkv: np.ndarray  # [hidden, (heads + 2 kv_heads) * head_dim], input-major for MatMul
    qkv_bias: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    attn_output: np.ndarray
    post_attention_norm: np.ndarray | None
    ffn_norm: np.ndarray
    gate_up: np.ndarray
    ffn_down: np.ndarray
    post_ffw_norm: np.ndarray | None


class _Builder:
    """Accumulates nodes and initializers under unique names."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.np_dtype = np.float16 if dtype == "float16" else np.float32
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, hint: str, value: np.ndarray, *, float_dtype: bool = True) -> str:
        name = self.name(hint)
        arr = value.astype(self.np_dtype) if float_dtype and value.dtype.kind == "f" else value
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def ints(self, hint: str, values: Iterable[int]) -> str:
        return self.const(hint, np.asarray(list(values), dtype=np.int64), float_dtype=False)

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: object) -> str:
        out = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def ops(self, op_type: str, inputs: list[str], count: int, **attrs: object) -> list[str]:
        outs = [self.name(op_type.lower()) for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs

    def rms_norm(self, x: str, weight: np.ndarray, eps: float) -> str:
        """``x / sqrt(mean(x^2, last axis) + eps) * w``, accumulated in float32."""
        x32 = self.op("Cast", [x], to=TensorProto.FLOAT) if self.dtype != "float32" else x
        # Pow -> ReduceMean -> Add -> Sqrt -> Div: the pattern ONNX Runtime fuses into one norm kernel.
        two = self.const("two", np.array(2.0, dtype=np.float32), float_dtype=False)
        mean_sq = self.op("ReduceMean", [self.op("Pow", [x32, two]), self.ints("axes", [-1])], keepdims=1)
        eps_c = self.const("eps", np.array(eps, dtype=np.float32), float_dtype=False)
        normed = self.op("Div", [x32, self.op("Sqrt", [self.op("Add", [mean_sq, eps_c])])])
        if self.dtype != "float32":
            normed = self.op("Cast", [normed], to=_ONNX_TYPES[self.dtype])
        return self.op("Mul", [normed, self.const("norm_w", weight)])

    def softcap(self, x: str, cap: float | None) -> str:
        if cap is None:
            return x
        c = self.const("cap", np.array(cap, dtype=np.float32))
        return self.op("Mul", [self.op("Tanh", [self.op("Div", [x, c])]), c])


def _weights(spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], list[_Layer]]:
    w = dict(weights)

    def take(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        if name not in w:
            raise ValueError(f"weight {name!r} is missing")
        arr = np.asarray(w.pop(name), dtype=np.float32)
        if shape is not None and arr.shape != shape:
            raise ValueError(f"weight {name!r} has shape {arr.shape}, expected {shape}")
        return arr

    def maybe(name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        return take(name, shape) if name in w else None

    d, hd, heads, kvh = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads
    layers = []
    for i in range(spec.num_layers):
        p = f"blk.{i}."
        q = take(p + "attn_q.weight", (heads * hd, d))
        k = take(p + "attn_k.weight", (kvh * hd, d))
        v = take(p + "attn_v.weight", (kvh * hd, d))
        bias = None
        if spec.qkv_bias:
            bias = np.concatenate([take(p + "attn_q.bias", (heads * hd,)), take(p + "attn_k.bias", (kvh * hd,)),
                                   take(p + "attn_v.bias", (kvh * hd,))])
        gate = take(p + "ffn_gate.weight", (spec.intermediate_size, d))
        up = take(p + "ffn_up.weight", (spec.intermediate_size, d))
        layers.append(_Layer(
            attn_norm=take(p + "attn_norm.weight", (d,)),
            qkv=np.concatenate([q, k, v]).T,
            qkv_bias=bias,
            q_norm=take(p + "attn_q_norm.weight", (hd,)) if spec.qk_norm else None,
            k_norm=take(p + "attn_k_norm.weight", (hd,)) if spec.qk_norm else None,
            attn_output=take(p + "attn_output.weight", (d, heads * hd)).T,
            post_attention_norm=take(p + "post_attention_norm.weight", (d,)) if spec.sandwich_norm else None,
            ffn_norm=take(p + "ffn_norm.weight", (d,)),
            gate_up=np.concatenate([gate, up]).T,
            ffn_down=take(p + "ffn_down.weight", (d, spec.intermediate_size)).T,
            post_ffw_norm=take(p + "post_ffw_norm.weight", (d,)) if spec.sandwich_norm else None,
        ))
    top = {"embed": take("token_embd.weight", (spec.vocab_size, d)), "output_norm": take("output_norm.weight", (d,))}
    head = maybe("output.weight", (spec.vocab_size, d))
    top["lm_head"] = (top["embed"] if head is None or spec.tie_embeddings else head).T
    return top, layers


def _rope(b: _Builder, x: str, cos: str, sin: str) -> str:
    """Rotate-half RoPE of ``x [N, heads, head_dim]`` by ``cos``/``sin`` ``[N, 1, head_dim/2]``."""
    x1, x2 = b.ops("Split", [x], 2, axis=-1, num_outputs=2)
    first = b.op("Sub", [b.op("Mul", [x1, cos]), b.op("Mul", [x2, sin])])
    second = b.op("Add", [b.op("Mul", [x2, cos]), b.op("Mul", [x1, sin])])
    return b.op("Concat", [first, second], axis=-1)


def _attend_group(b: _Builder, spec: ModelSpec, g: str, q: str, k_cache: str, v_cache: str, sliding: bool) -> str:
    """Attention of one padded group: ``[R * M, heads * head_dim]``."""
    kvh, hd = spec.num_kv_heads, spec.head_dim
    grp = spec.num_heads // kvh
    qp = b.op("Gather", [q, f"q_index_{g}"], axis=0)  # [R, M, H, hd]
    shape = b.op("Shape", [qp])
    r_m = b.op("Slice", [shape, b.ints("s", [0]), b.ints("e", [2])])
    qp = b.op("Reshape", [qp, b.op("Concat", [r_m, b.ints("kg", [kvh, grp, hd])], axis=0)])
    qp = b.op("Transpose", [qp], perm=[0, 2, 3, 1, 4])  # [R, K, g, M, hd]
    keys = b.op("Gather", [k_cache, f"kv_slots_{g}"], axis=0)  # [R, T, K, hd]
    keys = b.op("Unsqueeze", [b.op("Transpose", [keys], perm=[0, 2, 3, 1]), b.ints("ax", [2])])  # [R, K, 1, hd, T]
    scores = b.softcap(b.op("MatMul", [qp, keys]), spec.attn_softcap)  # [R, K, g, M, T]
    bias = b.op("Unsqueeze", [f"bias_local_{g}" if sliding else f"bias_{g}", b.ints("ax", [1, 2])])
    weights = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
    values = b.op("Gather", [v_cache, f"kv_slots_{g}"], axis=0)  # [R, T, K, hd]
    values = b.op("Unsqueeze", [b.op("Transpose", [values], perm=[0, 2, 1, 3]), b.ints("ax", [2])])  # [R, K, 1, T, hd]
    ctx = b.op("MatMul", [weights, values])  # [R, K, g, M, hd]
    valid = f"row_valid_local_{g}" if sliding else f"row_valid_{g}"
    ctx = b.op("Mul", [ctx, b.op("Unsqueeze", [valid, b.ints("ax", [1, 2])])])
    ctx = b.op("Transpose", [ctx], perm=[0, 3, 1, 2, 4])  # [R, M, K, g, hd]
    return b.op("Reshape", [ctx, b.ints("rows", [-1, spec.num_heads * hd])])


def _layer(b: _Builder, spec: ModelSpec, i: int, lw: _Layer, x: str) -> str:
    hd, heads, kvh, eps = spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.rms_norm_eps
    sliding = spec.is_sliding(i) and spec.sliding_window is not None
    suffix = "_local" if sliding else ""
    cos = b.op("Unsqueeze", [f"cos{suffix}", b.ints("ax", [1])])
    sin = b.op("Unsqueeze", [f"sin{suffix}", b.ints("ax", [1])])
    h = b.rms_norm(x, lw.attn_norm, eps)
    qkv = b.op("MatMul", [h, b.const(f"blk{i}_qkv", lw.qkv)])
    if lw.qkv_bias is not None:
        qkv = b.op("Add", [qkv, b.const(f"blk{i}_qkv_bias", lw.qkv_bias)])
    q, k, v = b.ops("Split", [qkv, b.ints("split", [heads * hd, kvh * hd, kvh * hd])], 3, axis=1)
    q = b.op("Reshape", [q, b.ints("qs", [-1, heads, hd])])
    k = b.op("Reshape", [k, b.ints("ks", [-1, kvh, hd])])
    v = b.op("Reshape", [v, b.ints("vs", [-1, kvh, hd])])
    if lw.q_norm is not None and lw.k_norm is not None:
        q = b.rms_norm(q, lw.q_norm, eps)
        k = b.rms_norm(k, lw.k_norm, eps)
    q = b.op("Mul", [_rope(b, q, cos, sin), b.const("scale", np.array(spec.scale, dtype=np.float32))])
    k = _rope(b, k, cos, sin)
    k_in, v_in, k_out, v_out = cache_names(i)
    b.nodes.append(helper.make_node("ScatterND", [k_in, "write_slots", k], [k_out]))
    b.nodes.append(helper.make_node("ScatterND", [v_in, "write_slots", v], [v_out]))
    parts = [_attend_group(b, spec, g, q, k_out, v_out, sliding) for g in GROUPS]
    ctx = b.op("Gather", [b.op("Concat", parts, axis=0), "out_index"], axis=0)  # [N, H * hd]
    o = b.op("MatMul", [ctx, b.const(f"blk{i}_attn_output", lw.attn_output)])
    if lw.post_attention_norm is not None:
        o = b.rms_norm(o, lw.post_attention_norm, eps)
    x = b.op("Add", [x, o])
    h = b.rms_norm(x, lw.ffn_norm, eps)
    gate, up = b.ops("Split", [b.op("MatMul", [h, b.const(f"blk{i}_gate_up", lw.gate_up)])], 2, axis=1, num_outputs=2)
    if spec.hidden_act == "silu":
        act = b.op("Mul", [gate, b.op("Sigmoid", [gate])])
    elif spec.hidden_act == "gelu_tanh":
        act = b.op("Gelu", [gate], approximate="tanh")
    else:
        raise ValueError(f"unsupported activation {spec.hidden_act!r}; expected 'silu' or 'gelu_tanh'")
    down = b.op("MatMul", [b.op("Mul", [act, up]), b.const(f"blk{i}_ffn_down", lw.ffn_down)])
    if lw.post_ffw_norm is not None:
        down = b.rms_norm(down, lw.post_ffw_norm, eps)
    return b.op("Add", [x, down])


def _inputs(spec: ModelSpec, dtype: str) -> list[onnx.ValueInfoProto]:
    f, i64 = _ONNX_TYPES[dtype], TensorProto.INT64
    half = spec.head_dim // 2
    vi = helper.make_tensor_value_info
    inputs = [vi("input_ids", i64, ["N"]), vi("write_slots", i64, ["N", 1]), vi("out_index", i64, ["N"]),
              vi("cos", f, ["N", half]), vi("sin", f, ["N", half]),
              vi("logit_index", i64, ["S"]), vi("hidden_index", i64, ["E"])]
    if _has_sliding(spec):
        inputs += [vi("cos_local", f, ["N", half]), vi("sin_local", f, ["N", half])]
    for g in GROUPS:
        r, m, t = f"R_{g}", f"M_{g}", f"T_{g}"
        inputs += [vi(f"q_index_{g}", i64, [r, m]), vi(f"kv_slots_{g}", i64, [r, t]),
                   vi(f"bias_{g}", f, [r, m, t]), vi(f"row_valid_{g}", f, [r, m, 1])]
        if _has_sliding(spec):
            inputs += [vi(f"bias_local_{g}", f, [r, m, t]), vi(f"row_valid_local_{g}", f, [r, m, 1])]
    for layer in range(spec.num_layers):
        k_in, v_in, _, _ = cache_names(layer)
        inputs += [vi(name, f, ["C", spec.num_kv_heads, spec.head_dim]) for name in (k_in, v_in)]
    return inputs


def _has_sliding(spec: ModelSpec) -> bool:
    return spec.sliding_window is not None and any(spec.is_sliding(i) for i in range(spec.num_layers))


def build_graph(spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], dtype: str) -> onnx.ModelProto:
    """The model's forward as an ONNX model (weights as initializers).

    Args:
        spec: Architecture.
        weights: ``(canonical name, float32 array)`` pairs (see ``pie_core.models.spec``).
        dtype: ``"float32"`` or ``"float16"``: weights, activations and the cache.

    Raises:
        ValueError: A weight is missing or misshapen, or the activation or dtype is unknown.
    """
    if dtype not in _ONNX_TYPES:
        raise ValueError(f"the ONNX graph is built in float32 or float16, not {dtype!r}")
    top, layers = _weights(spec, weights)
    b = _Builder(dtype)
    x = b.op("Gather", [b.const("embed", top["embed"]), "input_ids"], axis=0)
    if spec.embed_scale != 1.0:
        x = b.op("Mul", [x, b.const("embed_scale", np.array(spec.embed_scale, dtype=np.float32))])
    for i, lw in enumerate(layers):
        x = _layer(b, spec, i, lw, x)
    logits = b.rms_norm(b.op("Gather", [x, "logit_index"], axis=0), top["output_norm"], spec.rms_norm_eps)
    logits = b.softcap(b.op("MatMul", [logits, b.const("lm_head", top["lm_head"])]), spec.final_softcap)
    hidden = b.rms_norm(b.op("Gather", [x, "hidden_index"], axis=0), top["output_norm"], spec.rms_norm_eps)
    for name, src in (("logits", logits), ("hidden", hidden)):
        b.nodes.append(helper.make_node("Cast", [src], [name], to=TensorProto.FLOAT))
    f = _ONNX_TYPES[dtype]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["S", spec.vocab_size]),
               helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["E", spec.hidden_size])]
    for layer in range(spec.num_layers):
        _, _, k_out, v_out = cache_names(layer)
        outputs += [helper.make_tensor_value_info(n, f, ["C", spec.num_kv_heads, spec.head_dim])
                    for n in (k_out, v_out)]
    graph = helper.make_graph(b.nodes, f"pie_{spec.arch}", _inputs(spec, dtype), outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pie-backend-tensorrt")
    model.ir_version = 10
    return model
