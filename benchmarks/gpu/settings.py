"""What one run of the check measures: device, sizes (full or ``--tiny``), folders, and the phase's deadline.

The parent (:mod:`benchmarks.gpu.check`) writes one :class:`Settings` per phase as JSON; the phase's
child process reads it back (:func:`Settings.load`). Only the standard library here: the parent
imports this module and never imports torch.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Sizes", "Settings", "FULL", "TINY", "QWEN25_05B", "TINY_QWEN2"]

QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
)
"""Qwen2.5-0.5B's architecture (its config.json), built with random weights: the GGUF cannot travel."""

TINY_QWEN2 = dict(QWEN25_05B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
"""A qwen2 of a few hundred kilobytes for the CPU dry run (vocabulary larger than its tokenizer, as Qwen's is)."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each phase does."""

    model: dict
    """transformers ``Qwen2Config`` keyword arguments."""
    concurrency: tuple[int, ...]
    """Concurrent requests of the throughput phase."""
    new_tokens: int
    """New tokens per request (engine and transformers ``generate``)."""
    step_prompt: int
    """Prompt tokens per request of the backend step loop."""
    step_decode: int
    """Measured decode steps of the backend step loop (after ``step_warmup``)."""
    step_warmup: int
    logits_tokens: int
    """Tokens whose logits are compared with transformers (half one prefill, half a token a pass)."""
    greedy_tokens: int
    """Greedy tokens per prompt compared with transformers float32."""
    conformance_archs: tuple[str, ...]
    """Architectures of the conformance run (empty: all)."""
    conformance_select: str | None
    """A pytest ``-k`` expression (None: every case)."""
    conformance_dtypes: tuple[str, ...]
    """dtypes the torch backend's conformance runs in, in order, while time lasts."""


FULL = Sizes(
    model=QWEN25_05B,
    concurrency=(1, 64, 256),
    new_tokens=64,
    step_prompt=24,
    step_decode=48,
    step_warmup=4,
    logits_tokens=128,
    greedy_tokens=48,
    conformance_archs=(),
    conformance_select=None,
    conformance_dtypes=("float32", "bfloat16"),
)
TINY = Sizes(
    model=TINY_QWEN2,
    concurrency=(1, 4),
    new_tokens=6,
    step_prompt=6,
    step_decode=4,
    step_warmup=1,
    logits_tokens=12,
    greedy_tokens=6,
    conformance_archs=("qwen2",),
    conformance_select="forward or batching",
    conformance_dtypes=("float32",),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """One phase's view of the run."""

    device: str
    """``cuda`` or ``cpu``."""
    tiny: bool
    work: str
    """Folder for everything that does not come back (models, caches, conformance reports)."""
    deadline: float
    """``time.time()`` by which the phase should have stopped (the parent kills it a little after)."""
    sizes: Sizes
    extra: dict = field(default_factory=dict)
    """Facts earlier phases found (e.g. the device's bandwidth) that later ones read."""

    @property
    def model_dir(self) -> Path:
        return Path(self.work) / "model"

    @property
    def dtype(self) -> str:
        """The compute dtype of the throughput and bf16 checks: bfloat16 on CUDA, float32 on a CPU."""
        return "bfloat16" if self.device == "cuda" else "float32"

    def left(self) -> float:
        """Seconds until the deadline (negative once past)."""
        return self.deadline - time.time()

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Settings:
        raw = json.loads(Path(path).read_text())
        sizes = raw.pop("sizes")
        for key in ("concurrency", "conformance_archs", "conformance_dtypes"):
            sizes[key] = tuple(sizes[key])
        return cls(sizes=Sizes(**sizes), **raw)
