"""A tiny qwen2 GGUF (one layer, 258-token byte-level vocabulary, ~100 KB) the registry, the
weights cache and the cpu backend load in well under a second."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from pie_core.models.tokenizer_gguf import byte_to_unicode

HIDDEN, HEADS, KV_HEADS, FFN = 32, 4, 2, 48
HEAD_DIM = HIDDEN // HEADS


def write_tiny_qwen2(path: Path, seed: int = 0) -> Path:
    """Write the model to ``path`` (different ``seed`` → different weights, same header)."""
    rng = np.random.default_rng(seed)
    tokens = [*byte_to_unicode().values(), "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(1)
    w.add_embedding_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_feed_forward_length(FFN)
    w.add_context_length(512)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - 2) + [3, 3])
    w.add_token_merges([])
    w.add_eos_token_id(vocab - 1)

    def add(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    add("token_embd.weight", vocab, HIDDEN)
    add("output_norm.weight", HIDDEN)
    add("blk.0.attn_norm.weight", HIDDEN)
    add("blk.0.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
    add("blk.0.attn_q.bias", HEADS * HEAD_DIM)
    add("blk.0.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
    add("blk.0.attn_k.bias", KV_HEADS * HEAD_DIM)
    add("blk.0.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
    add("blk.0.attn_v.bias", KV_HEADS * HEAD_DIM)
    add("blk.0.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
    add("blk.0.ffn_norm.weight", HIDDEN)
    add("blk.0.ffn_gate.weight", FFN, HIDDEN)
    add("blk.0.ffn_up.weight", FFN, HIDDEN)
    add("blk.0.ffn_down.weight", HIDDEN, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
