"""Phase ``models``: Qwen2.5-0.5B's architecture with random weights, as a Hugging Face folder.

The real checkpoint cannot travel to the device machine (no network, 64 MiB), so transformers
builds the architecture from its config with random weights (seed 0, transformers' own
initialisation), stored in bfloat16: the torch backend reads it in bf16 exactly, and transformers
in float32 holds exactly the same values, so the exactness phase compares like with like.

The tokenizer is byte-level (256 byte tokens) plus the ChatML specials at ids 256..258: enough for
Pie's chat format and the engine's inferlets; the model's vocabulary is larger, as Qwen's is, so
generated ids beyond the tokenizer are exercised too. The conformance suite builds its own tiny
models (``conformance.models``).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu.record import Record
from benchmarks.gpu.settings import Settings

__all__ = ["run", "write_model", "write_tokenizer", "SPECIALS", "PAD_ID"]

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_ID = 256
"""``<|endoftext|>``: the left padding of transformers' batched ``generate``."""


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE without merges, the ChatML specials after the 256 bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: ord(c)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))


def write_model(folder: Path, config_kwargs: dict, device: str) -> dict[str, object]:
    """Random weights of ``Qwen2Config(**config_kwargs)`` saved as bf16 safetensors; returns facts."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen2Config(**config_kwargs, bos_token_id=PAD_ID, eos_token_id=PAD_ID + 2, pad_token_id=PAD_ID)
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.5B weights on a GPU takes a fraction of the CPU's time
        model = Qwen2ForCausalLM(config)
    model = model.to("cpu", torch.bfloat16)
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens (no stop token)
    model.save_pretrained(folder, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    return {"parameters": params, "bytes_on_disk": sum(f.stat().st_size for f in folder.glob("*.safetensors"))}


def run(settings: Settings, record: Record) -> None:
    folder = settings.model_dir
    stamp = folder / "built-by-check.json"  # a rerun with the same --work reuses the folder
    wanted = json.dumps(settings.sizes.model, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == wanted:
        facts: dict[str, object] = {"reused": True}
    else:
        stamp.unlink(missing_ok=True)
        facts = write_model(folder, settings.sizes.model, settings.device)
        write_tokenizer(folder)
        stamp.write_text(wanted)
    record.put("folder", str(folder))
    record.put("config", settings.sizes.model)
    for key, value in facts.items():
        record.put(key, value)
    from pie_core.models.registry import resolve_model

    source = resolve_model(str(folder))
    record.put("pie_spec", {"arch": source.spec.arch, "layers": source.spec.num_layers,
                            "vocab": source.spec.vocab_size, "tied": source.spec.tie_embeddings})
    ids = source.tokenizer.encode("hello")
    record.check("Pie reads the folder (spec, tokenizer, chat format)", len(ids) == 5,
                 f"{source.spec.arch}, {source.spec.num_layers} layers; 'hello' -> {ids}")
