"""transformers as the reference: its own loading of the GGUFs (the tokenizer memoised per test session)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np


@functools.cache
def hf_tokenizer(path: Path) -> Any:
    """transformers' own tokenizer built from a GGUF (the reference)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def hf_gguf_state_dict(path: Path) -> dict[str, np.ndarray]:
    """transformers' float32 state dict of a GGUF (``AutoModelForCausalLM(gguf_file=...)``); not
    memoised: each is read by one test, and kept it would hold 2-3 GB for the rest of the run."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype="float32")
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}
