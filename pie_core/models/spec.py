"""ModelSpec: the architecture hyper-parameters a backend needs to run a checkpoint.

Weights travel beside the spec as ``(name, array)`` pairs in the canonical naming below
(GGUF's names), float32 numpy arrays, matrices shaped ``[out_features, in_features]``:

    token_embd.weight            [vocab, hidden]
    output.weight                [vocab, hidden]   absent when ``tie_embeddings``
    output_norm.weight           [hidden]
    blk.{i}.attn_norm.weight     [hidden]
    blk.{i}.attn_q.weight        [heads*head_dim, hidden]   (+ .bias when ``qkv_bias``)
    blk.{i}.attn_k.weight        [kv_heads*head_dim, hidden] (+ .bias)
    blk.{i}.attn_v.weight        [kv_heads*head_dim, hidden] (+ .bias)
    blk.{i}.attn_q_norm.weight   [head_dim]   only when ``qk_norm``
    blk.{i}.attn_k_norm.weight   [head_dim]   only when ``qk_norm``
    blk.{i}.attn_output.weight   [hidden, heads*head_dim]
    blk.{i}.post_attention_norm.weight [hidden]  only when ``sandwich_norm``
    blk.{i}.ffn_norm.weight      [hidden]
    blk.{i}.ffn_gate.weight      [intermediate, hidden]
    blk.{i}.ffn_up.weight        [intermediate, hidden]
    blk.{i}.ffn_down.weight      [hidden, intermediate]
    blk.{i}.post_ffw_norm.weight [hidden]        only when ``sandwich_norm``

Conventions every reader normalises to, so backends need no per-format cases:
RMSNorm is ``x / rms(x) * w`` (Gemma's ``1 + w`` is folded into ``w`` at load);
Q/K rows are in the Hugging Face "rotate half" (NeoX) RoPE layout (llama GGUFs are un-permuted
at load); the embedding is multiplied by ``embed_scale`` before the first layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ModelSpec", "RopeConfig", "ARCHITECTURES"]

ARCHITECTURES = ("qwen2", "llama", "qwen3", "gemma3")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters.

    ``scaling`` is ``"none"``, ``"linear"`` (positions divided by ``factor``) or ``"llama3"``
    (frequency-dependent scaling with ``low_freq_factor``/``high_freq_factor`` around
    ``original_max_position``). ``local_theta`` is the base used by sliding-window layers
    (gemma3); ``None`` means those layers use ``theta`` too. When ``local_theta`` is set,
    ``scaling`` applies to the full-attention layers only: sliding layers use plain RoPE with
    ``local_theta`` (as transformers' Gemma 3 does).
    """

    theta: float = 10000.0
    local_theta: float | None = None
    scaling: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture of one decoder-only transformer checkpoint."""

    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position: int = 32768
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    hidden_act: str = "silu"  # "silu" or "gelu_tanh"; the MLP is act(gate(x)) * up(x)
    embed_scale: float = 1.0
    sandwich_norm: bool = False  # gemma3: norms after attention and after the MLP too
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # per layer "full" or "sliding"; empty = all full
    attn_scale: float | None = None  # None = head_dim ** -0.5
    attn_softcap: float | None = None
    final_softcap: float | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.arch!r}; supported: {', '.join(ARCHITECTURES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")

    @property
    def scale(self) -> float:
        """Softmax scale applied to q·k."""
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends only to the last ``sliding_window`` positions.

        The window includes the query itself: a query at position ``q`` attends to key
        positions ``k`` with ``q - sliding_window < k <= q`` (transformers'
        ``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``), i.e. at most
        ``sliding_window`` keys.
        """
        return bool(self.layer_types) and self.layer_types[layer] == "sliding"
