"""The backend's own decode step, timed through its hooks, and the HBM floor it is held to.

A decode step of R requests reads every weight once (the embedding table only for R rows, the tied
LM head in full) plus each request's KV; at batch 1 it cannot take less than those bytes over the
memory bandwidth. :func:`weight_bytes` counts them from the spec; :func:`decode_steps` runs R
prompts' prefill in one pass, then decode steps of one token a request (argmax), and times each
``pie_backend_forward`` call: the batch is assembled beforehand, as the engine's event loop does
while the previous batch runs, and a step ends when its sampled tokens are on the host.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager

import numpy as np

__all__ = ["weight_bytes", "kv_bytes_per_token", "decode_steps", "PAGE_SIZE"]

PAGE_SIZE = 16


def weight_bytes(spec, element_size: int) -> int:
    """Bytes of the weights one decode step reads: every layer's projections and norms, the final
    norm and the LM head (the tied embedding matrix, read in full for the logits)."""
    h, hd, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    per_layer = h * (q + 2 * kv) + q * h + 2 * inter * h + inter * h
    per_layer += (q + 2 * kv) if spec.qkv_bias else 0
    norms = spec.num_layers * 2 * h + h  # float32 on the residual stream, counted at the compute size
    return (spec.num_layers * per_layer + spec.vocab_size * h + norms) * element_size


def kv_bytes_per_token(spec, element_size: int) -> int:
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * element_size


def decode_steps(backend, vocab: int, requests: int, prompt: int, warmup: int, steps: int,
                 seed: int = 0, around: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> dict[str, float]:
    """Prefill ``requests`` random prompts of ``prompt`` tokens, then ``warmup + steps`` decode steps,
    the measured ``steps`` inside ``around()`` (a profiler, say).

    Returns:
        ``step_ms`` (median of the measured steps), ``step_ms_min``, ``prefill_ms`` and ``tps``
        (requests / median step).
    """
    from conformance.batches import kv_request
    from pie_core.scheduler.assemble import assemble
    from pie_core.scheduler.request import SampleSpec

    rng = np.random.default_rng(seed)
    per = -(-(prompt + warmup + steps + 1) // PAGE_SIZE)
    pages = [list(range(r * per, (r + 1) * per)) for r in range(requests)]
    sample = (SampleSpec(index=0),)

    def step(tokens: list[np.ndarray], start: int) -> tuple[float, np.ndarray]:
        reqs = [kv_request(t, pages[r], PAGE_SIZE, start=start,
                           samples=(SampleSpec(index=len(t) - 1),) if len(t) > 1 else sample)
                for r, t in enumerate(tokens)]
        batch = assemble(reqs, vocab)
        t0 = time.perf_counter()
        out = backend.pie_backend_forward(batch)
        return time.perf_counter() - t0, np.asarray(out.tokens)

    prefill_s, last = step([rng.integers(0, vocab, prompt, dtype=np.int32) for _ in range(requests)], 0)
    for i in range(warmup):
        _, last = step([np.array([t], dtype=np.int32) for t in last], prompt + i)
    times = []
    with around():
        for i in range(warmup, warmup + steps):
            seconds, last = step([np.array([t], dtype=np.int32) for t in last], prompt + i)
            times.append(seconds)
    median = float(np.median(times))
    return {"step_ms": median * 1e3, "step_ms_min": min(times) * 1e3, "prefill_ms": prefill_s * 1e3,
            "tps": requests / median}
