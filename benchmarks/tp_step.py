"""Decode-step time of the torch backend with tensor parallel (``tp=2``) against one rank, on a CPU.

A synthetic qwen2-shaped model (random float32 weights: timing does not depend on their values)
is loaded through the backend's hooks once per ``tp``; ``--batch`` requests are prefilled with
``--prompt`` tokens, then ``--steps`` decode steps of the whole batch are timed. The configurations
run alternately, step by step, so other load on the machine weighs on both alike; every rank gets
``cores / tp`` intra-op threads (the backend's default under tp), one rank all the cores.

    python benchmarks/tp_step.py                       # tp 1 and 2, batch 1 and 8
    python benchmarks/tp_step.py --tp 1 2 4 --batch 1 --json out.json

:func:`step_times` is what a scale-out benchmark imports: one model, one ``tp``, the decode-step
times in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Iterator

import numpy as np
import torch

from conformance.batches import kv_request
from conformance.models import random_weights
from pie_backend_torch import TorchBackend
from pie_core.hookspec import BackendOptions, ForwardBatch
from pie_core.models.spec import ModelSpec, RopeConfig
from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.request import SampleSpec

__all__ = ["bench_spec", "step_times", "StepRunner"]

PAGE = 16


def bench_spec(layers: int = 8, hidden: int = 512, heads: int = 8, kv_heads: int = 2, inter: int = 2048) -> ModelSpec:
    """A qwen2-shaped model (GQA, QKV bias, tied embeddings), ~40 M parameters by default."""
    return ModelSpec(
        arch="qwen2", vocab_size=8192, hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=hidden // heads, intermediate_size=inter, qkv_bias=True,
        tie_embeddings=True, rope=RopeConfig(theta=1e6),
    )


class StepRunner:
    """One loaded backend (``tp`` ranks) and a batch of sequences it decodes step by step."""

    def __init__(self, spec: ModelSpec, tp: int, batch: int, prompt: int, steps: int, threads: int | None = None) -> None:
        self.tp, self.batch = tp, batch
        self.threads = threads or max(1, (os.cpu_count() or 1) // tp)
        pages_each = -(-(prompt + steps + 1) // PAGE)
        self.backend = TorchBackend()
        extra: dict[str, int] = {"threads": self.threads} | ({"tp": tp} if tp > 1 else {})  # tp=1: the default options
        self.caps = self.backend.pie_backend_load_model(
            spec, random_weights(spec), BackendOptions(page_size=PAGE, kv_pages=batch * pages_each + 1, host_pages=1, extra=extra)
        )
        self.pages = [list(range(r * pages_each, (r + 1) * pages_each)) for r in range(batch)]
        self.length = prompt
        rng = np.random.default_rng(0)
        first = [kv_request(rng.integers(0, spec.vocab_size, prompt).tolist(), p, PAGE, samples=(SampleSpec(index=prompt - 1),)) for p in self.pages]
        self.tokens = self._run(assemble(first, spec.vocab_size))

    def _run(self, batch: ForwardBatch) -> np.ndarray:
        torch.set_num_threads(self.threads)  # process-wide: rank 0 of a tp run shares this process
        return self.backend.pie_backend_forward(batch).tokens

    def step(self) -> float:
        """One decode step of the whole batch; its wall time in seconds."""
        reqs = [kv_request([int(t)], p, PAGE, start=self.length, samples=(SampleSpec(index=0),)) for t, p in zip(self.tokens, self.pages)]
        batch = assemble(reqs, self.caps.vocab_size)
        start = time.perf_counter()
        self.tokens = self._run(batch)
        elapsed = time.perf_counter() - start
        self.length += 1
        return elapsed

    def close(self) -> None:
        self.backend.close()


def step_times(spec: ModelSpec, tp: int, batch: int = 1, prompt: int = 64, steps: int = 16) -> list[float]:
    """Decode-step times (seconds) of ``steps`` steps of ``batch`` sequences at ``tp`` ranks."""
    runner = StepRunner(spec, tp, batch, prompt, steps)
    try:
        return [runner.step() for _ in range(steps)]
    finally:
        runner.close()


def _interleaved(runners: list[StepRunner], steps: int) -> Iterator[list[float]]:
    for _ in range(steps):
        yield [r.step() for r in runners]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--threads", type=int, help="intra-op threads of every rank (default: the cores / tp)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    spec = bench_spec(layers=args.layers, hidden=args.hidden)
    results = []
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs; model {spec.num_layers} layers, "
          f"hidden {spec.hidden_size}, {spec.num_heads}/{spec.num_kv_heads} heads, MLP {spec.intermediate_size}, float32; "
          f"threads per rank: {args.threads or 'cores / tp'}")
    for batch in args.batch:
        runners = [StepRunner(spec, tp, batch, args.prompt, args.warmup + args.steps, args.threads) for tp in args.tp]
        try:
            for _ in _interleaved(runners, args.warmup):
                pass
            times = list(zip(*_interleaved(runners, args.steps)))
        finally:
            for r in runners:
                r.close()
        base = statistics.median(times[0])
        for tp, ts in zip(args.tp, times):
            med = statistics.median(ts)
            results.append({"tp": tp, "batch": batch, "median_ms": med * 1e3, "min_ms": min(ts) * 1e3, "vs_tp1": med / base})
            print(f"batch {batch:3d}  tp={tp}: median {med * 1e3:8.2f} ms/step  min {min(ts) * 1e3:8.2f}  ({med / base:.2f}x tp={args.tp[0]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"spec": str(spec), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
