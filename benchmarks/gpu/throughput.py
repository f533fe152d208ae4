"""Phase ``throughput``: decode tok/s of the torch backend, with and without CUDA graphs, against
transformers ``generate`` on the same device, and the batch-1 step against the HBM floor.

Three sides, each at every concurrency of the run (1, 64, 256 on a GPU):

* ``backend step``: the backend's decode step through its hooks (:mod:`.step_loop`): median step
  time and requests / step. At batch 1 it is held to the HBM floor (weight bytes / bandwidth).
* ``engine``: concurrent inferlets on one ``Engine`` (``benchmarks/decode.py``'s drivers: argmax,
  no stop token, the chat-formatted prompt). Batch 1: decode tok/s from the first to the last new
  token; N: decode-only tok/s = N x (tokens - 1) / (wall - a prefill-only run's wall).
* ``transformers``: ``generate`` (greedy, exactly the same number of new tokens, left-padded
  batch) in the same dtype on the same device, measured the same way.

Order: what the goals need first (graphs on: backend step, engine, transformers), then the
graphs-off sides, each only while the phase has time. Goals (issue 39): batch 1 >= 50% of the
HBM floor with CUDA graphs; 256 concurrent >= 5x transformers.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.gpu.record import Record, Table
from benchmarks.gpu.settings import Settings
from benchmarks.gpu.step_loop import PAGE_SIZE, decode_steps, kv_bytes_per_token, weight_bytes

__all__ = ["run", "GOAL_FLOOR_FRACTION", "GOAL_VS_TRANSFORMERS"]

GOAL_FLOOR_FRACTION = 0.5
GOAL_VS_TRANSFORMERS = 5.0
REPEATS = 2
"""Runs of each concurrent measurement (prefill-only and full); the fastest counts."""
_COLUMNS = ["side", "CUDA graphs", "concurrent", "step ms (median)", "decode tok/s", "total tok/s", "note"]


@dataclass(slots=True)
class _Out:
    """Where the sides write: the phase's record, its throughput table, and the numbers the goals read."""

    record: Record
    table: Table
    results: dict = field(default_factory=dict)


def _prompts(n: int, tag: str) -> list[str]:
    """``n`` distinct prompts; the tag leads, so no KV page is shared between requests or runs."""
    from benchmarks.decode import PROMPTS

    return [f"[{tag}-{i}] {PROMPTS[i % len(PROMPTS)]}" for i in range(n)]


def _add_rate(out: _Out, key: tuple, r: int, n: int, prefill: float, wall: float, note: str) -> None:
    """Decode-only tok/s of ``r`` requests of ``n`` new tokens: the tokens after the first over the
    wall time less a prefill-only run's (None when the difference is not positive: noise won)."""
    side, graphs = key[0], (key[1] if len(key) == 3 else "—")
    note += f"best of {REPEATS}: wall {wall:.3g} s, prefill-only {prefill:.3g} s"
    if wall <= prefill:
        out.table.add(side, graphs, r, None, None, r * n / wall, note + " (no decode time left: too few tokens)")
        return
    decode = r * (n - 1) / (wall - prefill)
    out.results[key] = {"tps": decode}
    out.table.add(side, graphs, r, 1e3 * r / decode, decode, r * n / wall, note)


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _backend_steps(settings: Settings, source, graphs: bool, out: _Out) -> None:
    from pie_backend_torch import TorchBackend
    from pie_core.hookspec import BackendOptions

    s = settings.sizes
    per = -(-(s.step_prompt + s.step_warmup + s.step_decode + 1) // PAGE_SIZE)
    backend = TorchBackend()
    backend.pie_backend_load_model(source.spec, source.weights(), BackendOptions(
        device=settings.device, dtype=settings.dtype, page_size=PAGE_SIZE, kv_pages=max(s.concurrency) * per + 1,
        host_pages=4, extra={"cuda_graphs": graphs}))
    for r in s.concurrency:
        if settings.left() < 3:
            out.table.add("backend step", graphs, r, None, None, None, "stopped: phase deadline")
            out.record.stopped(f"backend step at {r}, graphs {graphs}")
            continue
        m = decode_steps(backend, source.spec.vocab_size, r, s.step_prompt, s.step_warmup, s.step_decode)
        out.results[("backend", graphs, r)] = m
        out.table.add("backend step", graphs, r, m["step_ms"], m["tps"], None,
                  f"min {m['step_ms_min']:.3g} ms; prefill of {r}x{s.step_prompt} {m['prefill_ms']:.3g} ms")
    del backend
    _free(settings.device)


def _engine(settings: Settings, graphs: bool, out: _Out) -> list[list[int]]:
    from benchmarks.decode import engine_batch1, engine_concurrent
    from pie_core.engine.engine import Engine
    from pie_core.hookspec import BackendOptions

    s, n = settings.sizes, settings.sizes.new_tokens
    engine = Engine("torch", options=BackendOptions(device=settings.device, dtype=settings.dtype,
                                                   extra={"cuda_graphs": graphs}))
    engine.load(str(settings.model_dir))
    prompt_ids: list[list[int]] = []
    try:
        for r in s.concurrency:
            if settings.left() < 3:
                out.table.add("engine", graphs, r, None, None, None, "stopped: phase deadline")
                out.record.stopped(f"engine at {r}, graphs {graphs}")
                continue
            _, warm = engine_concurrent(engine, _prompts(r, "warm"), 3)  # compiles, captures this size's graphs
            if len(warm) > len(prompt_ids):
                prompt_ids = [w["prompt"] for w in warm]
            if r == 1:
                run = engine_batch1(engine, _prompts(1, "one")[0], n)
                out.results[("engine", graphs, 1)] = {"tps": run.decode_tps}
                out.table.add("engine", graphs, 1, 1e3 / run.decode_tps, run.decode_tps, run.e2e_tps, "one inferlet")
                continue
            prefill = min(engine_concurrent(engine, _prompts(r, f"p{k}"), 1)[0] for k in range(REPEATS))
            wall = min(engine_concurrent(engine, _prompts(r, f"n{k}"), n)[0] for k in range(REPEATS))
            _add_rate(out, ("engine", graphs, r), r, n, prefill, wall, "")
        if not engine.pools_whole():
            raise RuntimeError("the engine leaked KV pages")
    finally:
        asyncio.run(engine.close())
        del engine
        _free(settings.device)
    return prompt_ids


def _transformers(settings: Settings, prompt_ids: list[list[int]], out: _Out) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.decode import Run, _Stamps
    from benchmarks.gpu.model_folder import PAD_ID

    dev, n = settings.device, settings.sizes.new_tokens
    model = AutoModelForCausalLM.from_pretrained(str(settings.model_dir), dtype=getattr(torch, settings.dtype))
    model = model.to(dev).eval()

    def generate(prompts: list[list[int]], new: int, streamer: Any = None) -> float:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=PAD_ID, streamer=streamer)
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for r in settings.sizes.concurrency:
        if settings.left() < 3:
            out.table.add("transformers", "—", r, None, None, None, "stopped: phase deadline")
            out.record.stopped(f"transformers at {r}")
            continue
        prompts = [prompt_ids[i % len(prompt_ids)] for i in range(r)]
        generate(prompts, 3)  # warm-up
        if r == 1:
            stamps = _Stamps()
            start = time.perf_counter()
            generate(prompts, n, stamps)
            run = Run(prompts[0], [0] * n, start, stamps.stamps)
            out.results[("transformers", 1)] = {"tps": run.decode_tps}
            out.table.add("transformers", "—", 1, 1e3 / run.decode_tps, run.decode_tps, run.e2e_tps, f"{settings.dtype}, generate")
            continue
        prefill = min(generate(prompts, 1) for _ in range(REPEATS))
        wall = min(generate(prompts, n) for _ in range(REPEATS))
        _add_rate(out, ("transformers", r), r, n, prefill, wall, f"{settings.dtype}, generate; ")
    del model
    _free(dev)


def _goals(settings: Settings, record: Record, results: dict, floor_ms: float) -> None:
    on_gpu = settings.device == "cuda"
    top = max(settings.sizes.concurrency)
    b1 = results.get(("backend", on_gpu, 1))
    if b1 is not None:
        frac = floor_ms / b1["step_ms"]
        record.put("batch1_floor_fraction", frac)
        record.check(f"batch-1 step >= {GOAL_FLOOR_FRACTION:.0%} of the HBM floor with CUDA graphs",
                     frac >= GOAL_FLOOR_FRACTION if on_gpu else None,
                     f"step {b1['step_ms']:.3g} ms, floor {floor_ms:.3g} ms: {frac:.1%}" + ("" if on_gpu else " (CPU dry run: no goal)"))
    ours, theirs = results.get(("engine", on_gpu, top)), results.get(("transformers", top))
    if ours is not None and theirs is not None:
        ratio = ours["tps"] / theirs["tps"]
        record.put(f"engine_vs_transformers_at_{top}", ratio)
        record.check(f"{top} concurrent decode >= {GOAL_VS_TRANSFORMERS:g}x transformers",
                     ratio >= GOAL_VS_TRANSFORMERS if on_gpu else None,
                     f"engine {ours['tps']:.4g} tok/s vs transformers {theirs['tps']:.4g} tok/s: {ratio:.2f}x"
                     + ("" if on_gpu else " (CPU dry run: no goal)"))


def _chat_ids(source, prompts: list[str]) -> list[list[int]]:
    """The prompts as one user turn and the assistant cue (what the engine's inferlets send)."""
    chat = source.chat
    return [chat.user(p) + chat.cue() for p in prompts]


def _guarded(record: Record, name: str, fn) -> Any:
    """Run one side; a failure is recorded (with its traceback) and the phase goes on."""
    import traceback

    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - one side failing must not cost the others
        record.check(f"{name} ran", False, f"{type(exc).__name__}: {exc}"[:500])
        record.put(f"traceback_{name}", traceback.format_exc()[-3000:])
        return None


def run(settings: Settings, record: Record) -> None:
    import torch

    from pie_core.models.registry import resolve_model

    source = resolve_model(str(settings.model_dir))
    element = torch.empty(0, dtype=getattr(torch, settings.dtype)).element_size()
    wbytes = weight_bytes(source.spec, element)
    bandwidth = settings.extra.get("hbm_bandwidth", {}).get("bytes_per_s")
    if not bandwidth:
        raise RuntimeError("the environment phase found no bandwidth: it must run first")
    floor_ms = wbytes / bandwidth * 1e3
    record.put("hbm_floor", {"weight_bytes": wbytes, "kv_bytes_per_token": kv_bytes_per_token(source.spec, element),
                             "bandwidth_tbps": bandwidth / 1e12, "source": settings.extra["hbm_bandwidth"]["source"],
                             "floor_ms": floor_ms, "floor_tps_batch1": 1e3 / floor_ms})
    out = _Out(record, record.table(f"decode throughput ({settings.dtype}, {settings.sizes.new_tokens} new tokens a request)", _COLUMNS))
    prompt_ids = _chat_ids(source, _prompts(max(settings.sizes.concurrency), "warm"))
    graph_settings = (True, False) if settings.device == "cuda" else (False,)
    n_settings = len(graph_settings)
    for i, graphs in enumerate(graph_settings):
        label = f"graphs {'on' if graphs else 'off'}"
        if settings.left() >= 5:
            _guarded(record, f"backend step, {label}", lambda: _backend_steps(settings, source, graphs, out))
        if settings.left() >= 5:
            got = _guarded(record, f"engine, {label}", lambda: _engine(settings, graphs, out))
            prompt_ids = got or prompt_ids
        if i == 0:
            if settings.left() >= 5:
                _guarded(record, "transformers", lambda: _transformers(settings, prompt_ids, out))
            _goals(settings, record, out.results, floor_ms)
        if settings.left() < 5 and i + 1 < n_settings:
            out.record.stopped("the graphs-off sides")
            break
