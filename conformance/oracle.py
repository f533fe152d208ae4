"""The suite's numerical oracle: the tiny models' forward pass in float64 NumPy, from the model math.

It shares no code with any backend (nor with ``pie_core.backend_kit``): it is written from the
architecture as :class:`~pie_core.models.spec.ModelSpec` documents it, which is Hugging Face
transformers' math for each family:

- ``x = token_embd[t] * embed_scale``;
- per layer ``h = rms(x) * attn_norm``; ``q, k, v = h W^T (+ bias)``; with ``qk_norm`` each head's
  q and k is RMS-normed over ``head_dim``; RoPE rotates q and k in the "rotate half" layout at the
  token's *position* (llama3 or linear scaling; sliding layers use ``local_theta`` unscaled when
  it is set); K/V go to the token's write slot;
- grouped-query attention over the request's KV slots: query head ``h`` reads KV head
  ``h // (heads / kv_heads)``; ``softmax(q.k * scale)`` (``attn_softcap * tanh(s / cap)`` when
  set) over the slots the row may see: the custom mask row, else every slot up to its own write
  slot; sliding layers also hide keys whose position is ``<= q_pos - window``;
- ``x += o W_o^T`` (RMS-normed first with ``sandwich_norm``), then the MLP
  ``down(act(gate(h)) * up(h))`` on ``h = rms(x) * ffn_norm`` (normed after too with
  ``sandwich_norm``), ``act`` SiLU or tanh-GELU;
- the final ``rms(x) * output_norm`` is the embedding; logits are it times ``output`` (or
  ``token_embd`` when tied), through ``final_softcap * tanh(z / cap)`` when set.

With ``rounding="bfloat16"`` it rounds (to nearest even) where a bfloat16 backend must: the
weights, every matmul's inputs and outputs, the stored K/V and the logits, and nothing else (norms,
RoPE, softmax and sums stay float64). That is the most faithful bfloat16 implementation there can
be; its distance to the float64 oracle is what the suite's bfloat16 tolerance is derived from
(``tests/conformance/test_tolerances.py``).

It reads the cases' :class:`~pie_core.scheduler.request.ForwardRequest` objects directly (page
list, last page length, write slots, positions, bool mask), so it does not run the core's batch
assembly either. Its KV store keeps float64 K and V and the position written to every slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from pie_core.hookspec import CopyKind
from pie_core.models.spec import ModelSpec
from pie_core.scheduler.request import ForwardRequest

__all__ = ["Oracle", "OracleRows", "inverse_frequencies", "round_bfloat16", "ROUNDINGS"]


def round_bfloat16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16 (ties to even), as float64."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _exact(x: np.ndarray) -> np.ndarray:
    return x


ROUNDINGS = {None: _exact, "bfloat16": round_bfloat16}
"""The oracle's ``rounding`` choices: where a low-precision backend must round, to what."""


@dataclass(frozen=True, slots=True)
class OracleRows:
    """What the oracle computed for one request: ``logits[n, vocab]`` and ``hidden[n, hidden]``
    (the final-normed hidden state) of every input row, float64."""

    logits: np.ndarray
    hidden: np.ndarray


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _softmax_last(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def inverse_frequencies(spec: ModelSpec, sliding: bool) -> np.ndarray:
    """RoPE inverse frequencies ``[head_dim / 2]`` of a full or a sliding layer."""
    rope, d = spec.rope, spec.head_dim
    local = sliding and rope.local_theta is not None
    base = rope.local_theta if local else rope.theta
    freq = 1.0 / float(base) ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if local or rope.scaling == "none":
        return freq
    if rope.scaling == "linear":
        return freq / rope.factor
    if rope.scaling == "llama3":
        wavelength = 2.0 * np.pi / freq
        low_wavelength = rope.original_max_position / rope.low_freq_factor  # longer: divided by factor
        high_wavelength = rope.original_max_position / rope.high_freq_factor  # shorter: unchanged
        blend = (rope.original_max_position / wavelength - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        middle = (1.0 - blend) * freq / rope.factor + blend * freq
        return np.where(wavelength > low_wavelength, freq / rope.factor, np.where(wavelength < high_wavelength, freq, middle))
    raise ValueError(f"the oracle knows RoPE scaling none, linear and llama3, not {rope.scaling!r}")


def _rotate(x: np.ndarray, positions: np.ndarray, freq: np.ndarray) -> np.ndarray:
    """Rotate ``x[n, heads, d]`` at ``positions[n]`` in the rotate-half layout."""
    angle = positions.astype(np.float64)[:, None] * freq[None, :]  # [n, d/2]
    cos = np.concatenate([np.cos(angle), np.cos(angle)], axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angle), np.sin(angle)], axis=-1)[:, None, :]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class Oracle:
    """One tiny model and its paged float64 KV store.

    Args:
        spec: The architecture.
        weights: Canonical-name weights (as :func:`conformance.models.random_weights` yields).
        num_pages, num_host_pages, page_size: The pool, as the backend under test was given it.
        rounding: None (float64 throughout), or ``"bfloat16"`` (see the module's notes).

    Raises:
        ValueError: A weight the architecture needs is missing or misshapen, or the rounding is
            unknown.
    """

    def __init__(
        self,
        spec: ModelSpec,
        weights: Iterable[tuple[str, np.ndarray]],
        num_pages: int,
        num_host_pages: int,
        page_size: int,
        rounding: str | None = None,
    ) -> None:
        if rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {rounding!r}; choose from {list(ROUNDINGS)}")
        self.spec = spec
        self.page_size = page_size
        self.r = ROUNDINGS[rounding]
        self.w = {name: self.r(np.asarray(a, dtype=np.float64)) for name, a in weights}
        self._check_weights()
        shape = (spec.num_layers, num_pages, page_size, spec.num_kv_heads, spec.head_dim)
        host = (spec.num_layers, num_host_pages, page_size, spec.num_kv_heads, spec.head_dim)
        self.k, self.v = np.zeros(shape), np.zeros(shape)
        self.host_k, self.host_v = np.zeros(host), np.zeros(host)
        self.pos = np.full((num_pages, page_size), -1, dtype=np.int64)  # -1: never written
        self.host_pos = np.full((num_host_pages, page_size), -1, dtype=np.int64)
        self.freq = [inverse_frequencies(spec, spec.is_sliding(i)) for i in range(spec.num_layers)]

    def _check_weights(self) -> None:
        s = self.spec
        q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        need = {"token_embd.weight": (s.vocab_size, s.hidden_size), "output_norm.weight": (s.hidden_size,)}
        if not s.tie_embeddings:
            need["output.weight"] = (s.vocab_size, s.hidden_size)
        for i in range(s.num_layers):
            p = f"blk.{i}."
            need |= {
                p + "attn_norm.weight": (s.hidden_size,),
                p + "attn_q.weight": (q_out, s.hidden_size),
                p + "attn_k.weight": (kv_out, s.hidden_size),
                p + "attn_v.weight": (kv_out, s.hidden_size),
                p + "attn_output.weight": (s.hidden_size, q_out),
                p + "ffn_norm.weight": (s.hidden_size,),
                p + "ffn_gate.weight": (s.intermediate_size, s.hidden_size),
                p + "ffn_up.weight": (s.intermediate_size, s.hidden_size),
                p + "ffn_down.weight": (s.hidden_size, s.intermediate_size),
            }
            if s.qkv_bias:
                need |= {p + "attn_q.bias": (q_out,), p + "attn_k.bias": (kv_out,), p + "attn_v.bias": (kv_out,)}
            if s.qk_norm:
                need |= {p + "attn_q_norm.weight": (s.head_dim,), p + "attn_k_norm.weight": (s.head_dim,)}
            if s.sandwich_norm:
                need |= {p + "post_attention_norm.weight": (s.hidden_size,), p + "post_ffw_norm.weight": (s.hidden_size,)}
        for name, shape in need.items():
            got = self.w.get(name)
            if got is None or got.shape != shape:
                found = "missing" if got is None else f"of shape {got.shape}"
                raise ValueError(f"the oracle needs {name} of shape {shape}, found it {found}")

    # -- the KV store ---------------------------------------------------------------------

    def _slots(self, req: ForwardRequest) -> tuple[int, np.ndarray, np.ndarray]:
        """The request's KV length and the (page, offset) of each of its slots."""
        p = self.page_size
        pages = np.asarray(req.page_ids, dtype=np.int64)
        if len(pages) == 0 or not 1 <= req.last_page_len <= p:
            raise ValueError(f"a request needs pages and 1 <= last_page_len <= {p}, got {len(pages)} and {req.last_page_len}")
        if pages.min() < 0 or pages.max() >= self.pos.shape[0]:
            raise ValueError(f"page ids must be in [0, {self.pos.shape[0]}), got {pages.tolist()}")
        kv_len = (len(pages) - 1) * p + int(req.last_page_len)
        slots = np.arange(kv_len)
        return kv_len, pages[slots // p], slots % p

    def copy_pages(self, kind: CopyKind, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy every layer's K, V and the slot positions of whole pages.

        Raises:
            ValueError: Lengths differ or an id is outside its pool.
        """
        s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        if s.shape != d.shape:
            raise ValueError(f"copy of {len(s)} pages onto {len(d)}")
        device = (self.k, self.v, self.pos)
        host = (self.host_k, self.host_v, self.host_pos)
        source, target = {
            CopyKind.DEVICE_TO_DEVICE: (device, device),
            CopyKind.DEVICE_TO_HOST: (device, host),
            CopyKind.HOST_TO_DEVICE: (host, device),
        }[CopyKind(kind)]
        for ids, pool in ((s, source), (d, target)):
            if len(ids) and (ids.min() < 0 or ids.max() >= pool[2].shape[0]):
                raise ValueError(f"page ids must be in [0, {pool[2].shape[0]}), got {ids.tolist()}")
        k, v, pos = source[0][:, s], source[1][:, s], source[2][s]  # copies, so src and dst may overlap
        target[0][:, d], target[1][:, d], target[2][d] = k, v, pos

    # -- the forward pass ------------------------------------------------------------------

    def forward(self, requests: Sequence[ForwardRequest]) -> list[OracleRows]:
        """Run the requests one after another (each writes its K/V, then reads its KV).

        Raises:
            ValueError: A request names an adapter or zo seed (the oracle holds none; merge the
                adapter into the weights), a slot outside its KV, a row that may see no slot, or
                a slot never written.
        """
        return [self._request(r) for r in requests]

    def _request(self, req: ForwardRequest) -> OracleRows:
        s = self.spec
        if req.adapter_id >= 0 or req.zo_seed != 0:
            raise ValueError("the oracle runs no adapters: load it with the adapter merged into its weights")
        tokens = np.asarray(req.token_ids, dtype=np.int64)
        positions = np.asarray(req.positions, dtype=np.int64)
        writes = np.asarray(req.write_slots, dtype=np.int64)
        kv_len, slot_page, slot_off = self._slots(req)
        if len(writes) and (writes.min() < 0 or writes.max() >= kv_len):
            raise ValueError(f"write slots {writes.tolist()} outside the KV length {kv_len}")
        if req.attention_mask is None:
            sees = np.arange(kv_len)[None, :] <= writes[:, None]
        else:
            sees = np.asarray(req.attention_mask, dtype=bool)
            if sees.shape != (len(tokens), kv_len):
                raise ValueError(f"mask of shape {sees.shape}, expected {(len(tokens), kv_len)}")
        w_page, w_off = slot_page[writes], slot_off[writes]
        self.pos[w_page, w_off] = positions
        key_pos = self.pos[slot_page, slot_off]
        if (key_pos[sees.any(axis=0)] < 0).any():
            raise ValueError("a row attends a slot that no pass has written")

        x = self.w["token_embd.weight"][tokens] * s.embed_scale
        for layer in range(s.num_layers):
            visible = sees
            if s.is_sliding(layer) and s.sliding_window is not None:
                visible = sees & (key_pos[None, :] > positions[:, None] - s.sliding_window)
            if not visible.any(axis=1).all():
                raise ValueError(f"row {int(np.flatnonzero(~visible.any(axis=1))[0])} may see no KV slot")
            x = self._layer(layer, x, positions, w_page, w_off, slot_page, slot_off, visible)
        hidden = _rms(x, self.w["output_norm.weight"], s.rms_norm_eps)
        head = self.w["token_embd.weight" if s.tie_embeddings else "output.weight"]
        logits = self.r(self.r(hidden) @ head.T)
        if s.final_softcap:
            logits = s.final_softcap * np.tanh(logits / s.final_softcap)
        return OracleRows(logits, hidden)

    def _layer(
        self,
        layer: int,
        x: np.ndarray,
        positions: np.ndarray,
        w_page: np.ndarray,
        w_off: np.ndarray,
        slot_page: np.ndarray,
        slot_off: np.ndarray,
        visible: np.ndarray,
    ) -> np.ndarray:
        s, w, p, r = self.spec, self.w, f"blk.{layer}.", self.r
        n, hd, kvh = x.shape[0], s.head_dim, s.num_kv_heads
        group = s.num_heads // kvh

        def proj(name: str, a: np.ndarray) -> np.ndarray:
            out = a @ w[p + name + ".weight"].T
            bias = w.get(p + name + ".bias")
            return r(out if bias is None else out + bias)

        h = r(_rms(x, w[p + "attn_norm.weight"], s.rms_norm_eps))
        q = proj("attn_q", h).reshape(n, s.num_heads, hd)
        k = proj("attn_k", h).reshape(n, kvh, hd)
        v = proj("attn_v", h).reshape(n, kvh, hd)
        if s.qk_norm:
            q = _rms(q, w[p + "attn_q_norm.weight"], s.rms_norm_eps)
            k = _rms(k, w[p + "attn_k_norm.weight"], s.rms_norm_eps)
        q, k = r(_rotate(q, positions, self.freq[layer])), r(_rotate(k, positions, self.freq[layer]))
        self.k[layer, w_page, w_off] = k
        self.v[layer, w_page, w_off] = v
        keys = self.k[layer, slot_page, slot_off]  # [kv_len, kvh, hd]
        values = self.v[layer, slot_page, slot_off]
        scores = np.einsum("nagd,kad->nagk", q.reshape(n, kvh, group, hd), keys) * s.scale
        if s.attn_softcap:
            scores = s.attn_softcap * np.tanh(scores / s.attn_softcap)
        scores = np.where(visible[:, None, None, :], scores, -np.inf)
        attended = r(np.einsum("nagk,kad->nagd", _softmax_last(scores), values).reshape(n, s.num_heads * hd))
        o = r(attended @ w[p + "attn_output.weight"].T)
        if s.sandwich_norm:
            o = _rms(o, w[p + "post_attention_norm.weight"], s.rms_norm_eps)
        x = x + o
        h = r(_rms(x, w[p + "ffn_norm.weight"], s.rms_norm_eps))
        act = _gelu_tanh if s.hidden_act == "gelu_tanh" else _silu
        if s.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"the oracle knows hidden_act silu and gelu_tanh, not {s.hidden_act!r}")
        gate, up = r(h @ w[p + "ffn_gate.weight"].T), r(h @ w[p + "ffn_up.weight"].T)
        m = r(r(act(gate) * up) @ w[p + "ffn_down.weight"].T)
        if s.sandwich_norm:
            m = _rms(m, w[p + "post_ffw_norm.weight"], s.rms_norm_eps)
        return x + m
