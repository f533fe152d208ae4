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


def write_tiny_hf_folder(folder: Path, seed: int = 0) -> Path:
    """The same architecture as a Hugging Face folder: ``config.json``, ``model.safetensors``
    (transformers' names) and a byte-level ``tokenizer.json``, ~100 KB."""
    import json

    from safetensors.numpy import save_file
    from tokenizers import AddedToken, decoders, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE

    rng = np.random.default_rng(seed)
    chars = list(byte_to_unicode().values())
    vocab = len(chars) + 2
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": vocab, "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}))

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    p = "model.layers.0."
    save_file({"model.embed_tokens.weight": t(vocab, HIDDEN), "model.norm.weight": t(HIDDEN),
               p + "input_layernorm.weight": t(HIDDEN), p + "post_attention_layernorm.weight": t(HIDDEN),
               p + "self_attn.q_proj.weight": t(HEADS * HEAD_DIM, HIDDEN), p + "self_attn.q_proj.bias": t(HEADS * HEAD_DIM),
               p + "self_attn.k_proj.weight": t(KV_HEADS * HEAD_DIM, HIDDEN), p + "self_attn.k_proj.bias": t(KV_HEADS * HEAD_DIM),
               p + "self_attn.v_proj.weight": t(KV_HEADS * HEAD_DIM, HIDDEN), p + "self_attn.v_proj.bias": t(KV_HEADS * HEAD_DIM),
               p + "self_attn.o_proj.weight": t(HIDDEN, HEADS * HEAD_DIM), p + "mlp.gate_proj.weight": t(FFN, HIDDEN),
               p + "mlp.up_proj.weight": t(FFN, HIDDEN), p + "mlp.down_proj.weight": t(HIDDEN, FFN)},
              str(folder / "model.safetensors"))
    tok = HFTokenizer(BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder
