"""Phase ``profile``: where a decode step's time goes, so a lease's fixes start from data.

Two views of the same backend decode steps (:mod:`.step_loop`, CUDA graphs on where the device
has them), at batch 1 and at the run's largest concurrency:

* ``torch.profiler``: the ops by self host time and by self device time, per step, and the
  device's busy time per step (the sum of its kernels) against the step's wall time: a step whose
  device is busy a small part of its wall time is bound by the host;
* ``cProfile``: the Python functions by their own time per step (the host side's Python).

Then the engine at the largest concurrency under ``cProfile`` (its event loop: how much of a token's
time is Pie's own Python). Each view is a table of the record; nothing here is a goal.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import pstats
from typing import Any, Iterator

from benchmarks.gpu.record import Record
from benchmarks.gpu.settings import Settings
from benchmarks.gpu.step_loop import PAGE_SIZE, decode_steps

__all__ = ["run", "TOP"]

TOP = 20
"""Rows of each table."""
_STEPS = 12


def _device_us(event: Any) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def _torch_profile(record: Record, settings: Settings, backend: Any, vocab: int, r: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if settings.device == "cuda" else [])
    holder: dict[str, Any] = {}

    @contextlib.contextmanager
    def around() -> Iterator[None]:
        with profile(activities=activities) as prof:
            yield
        holder["prof"] = prof

    m = decode_steps(backend, vocab, r, settings.sizes.step_prompt, settings.sizes.step_warmup, _STEPS, around=around)
    events = holder["prof"].key_averages()
    busy_us = sum(_device_us(e) for e in events if e.device_type is not None and "CUDA" in str(e.device_type))
    record.put(f"profile_step_at_{r}", {"wall_ms": m["step_ms"], "device_busy_ms": busy_us / 1e3 / _STEPS,
                                       "device_busy_fraction": busy_us / 1e3 / _STEPS / m["step_ms"]})
    for key, label, value in (("host", "self host", lambda e: e.self_cpu_time_total),
                              ("device", "self device", _device_us)):
        table = record.table(f"torch.profiler at {r} concurrent: top ops by {label} time",
                             ["op", "self host ms/step", "self device ms/step", "calls/step"])
        ranked = sorted(events, key=value, reverse=True)[:TOP]
        for e in ranked:
            if value(e) <= 0:
                break
            table.add(e.key[:90], e.self_cpu_time_total / 1e3 / _STEPS, _device_us(e) / 1e3 / _STEPS, e.count / _STEPS)


def _python_profile(record: Record, title: str, fn: Any, per: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    stats = pstats.Stats(prof).sort_stats("tottime")
    table = record.table(title, ["function", "own ms/unit", "cumulative ms/unit", "calls/unit"])
    for func in stats.fcn_list[:TOP]:  # type: ignore[attr-defined]
        calls, _, own, cumulative, _ = stats.stats[func]  # type: ignore[attr-defined]
        where = f"{func[0].rsplit('/', 2)[-1]}:{func[1]}({func[2]})" if func[0] != "~" else func[2]
        table.add(where[:90], own * 1e3 / per, cumulative * 1e3 / per, calls / per)


def _engine(record: Record, settings: Settings, r: int) -> None:
    from benchmarks.decode import engine_concurrent
    from benchmarks.gpu.throughput import _prompts
    from pie_core.engine.engine import Engine
    from pie_core.hookspec import BackendOptions

    n = settings.sizes.new_tokens
    engine = Engine("torch", options=BackendOptions(device=settings.device, dtype=settings.dtype))
    engine.load(str(settings.model_dir))
    try:
        engine_concurrent(engine, _prompts(r, "warm"), 3)
        wall: dict[str, float] = {}
        _python_profile(record, f"cProfile of the engine, {r} inferlets x {n} tokens: top functions per token",
                        lambda: wall.setdefault("s", engine_concurrent(engine, _prompts(r, "prof"), n)[0]), r * n)
        record.put(f"profile_engine_at_{r}", {"wall_s": wall["s"], "tokens": r * n, "us_per_token": wall["s"] / (r * n) * 1e6})
    finally:
        asyncio.run(engine.close())


def run(settings: Settings, record: Record) -> None:
    from pie_backend_torch import TorchBackend
    from pie_core.hookspec import BackendOptions
    from pie_core.models.registry import resolve_model

    source = resolve_model(str(settings.model_dir))
    s = settings.sizes
    top = max(s.concurrency)
    per = -(-(s.step_prompt + s.step_warmup + 2 * _STEPS + 1) // PAGE_SIZE)
    backend = TorchBackend()
    backend.pie_backend_load_model(source.spec, source.weights(), BackendOptions(
        device=settings.device, dtype=settings.dtype, page_size=PAGE_SIZE, kv_pages=top * per + 1, host_pages=4,
        extra={"cuda_graphs": settings.device == "cuda"}))
    vocab = source.spec.vocab_size
    for r in sorted({1, top}):
        if settings.left() < 5:
            record.stopped(f"profile at {r}")
            continue
        _torch_profile(record, settings, backend, vocab, r)
        _python_profile(record, f"cProfile of the backend step at {r} concurrent: top functions per step",
                        lambda: decode_steps(backend, vocab, r, s.step_prompt, s.step_warmup, _STEPS), _STEPS + s.step_warmup + 1)
    del backend
    if settings.left() >= 10:
        _engine(record, settings, top)
    else:
        record.stopped("the engine's profile")
