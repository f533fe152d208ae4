"""Write a random PEFT LoRA adapter for the default model, to try ``examples/lora`` with.

Not an inferlet: a plain script on transformers + peft (``pip install transformers peft
torch``). It loads transformers' model of the default model's GGUF (the one ``pie`` assembles
under ``~/.cache/pie``), wraps it with a PEFT ``LoraConfig`` over every projection, gives the
``lora_B`` matrices small random values (PEFT starts them at zero, which would change nothing)
and saves the folder with ``save_pretrained``::

    python examples/lora/make_adapter.py /tmp/my-adapter
    pie run lora -- --adapter /tmp/my-adapter

A larger ``--scale`` changes the replies more; from about 0.05 on they drift into other
languages and repetition.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where to write adapter_config.json and adapter_model.safetensors")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    parser.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha (default 16)")
    parser.add_argument("--scale", type=float, default=0.02, help="standard deviation of the lora_B values (default 0.02)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args()

    import peft
    import torch
    import transformers

    from pie_core.models.default_model import DEFAULT_MODEL, ensure_gguf

    gguf = ensure_gguf(DEFAULT_MODEL)
    print(f"loading {gguf.name} into transformers (a minute on a small machine)...")
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=TARGETS, lora_dropout=0.0,
                             init_lora_weights=True)  # A random, B zero: B is filled below
    wrapped = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * args.scale)
    wrapped.save_pretrained(args.folder, save_embedding_layers=False)
    print(f"wrote a rank-{args.rank} PEFT LoRA adapter to {args.folder}; try it with:\n"
          f"  pie run lora -- --adapter {args.folder}")


if __name__ == "__main__":
    main()
