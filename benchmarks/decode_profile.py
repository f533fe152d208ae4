"""Where one decode step of the torch backend spends its time, on the default model.

The engine serves a batch-1 generation and 32 concurrent ones; the forward batches the backend
received are recorded, and one pure decode batch of each size (every request one token) is
replayed through ``pie_backend_forward`` on the backend's thread with the engine idle: the median wall time of the step,
then one replay under ``torch.profiler``, its ops grouped into what they are for.

    python benchmarks/decode_profile.py                       # torch in its default CPU mode
    python benchmarks/decode_profile.py --extra '{"quant": "int4"}' --rows 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from decode import PROMPTS, engine_batch1, engine_concurrent, log, machine  # noqa: E402
from pie_core.backend import BackendCalls
from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions, ForwardBatch

# Profiler op name -> group, first match wins (substrings).
GROUPS = (
    ("linear: pie q4 x int8 kernel", ("pie_cpu::q4_linear",)),
    ("linear: pie q8 / q5 x int8 kernels", ("pie_cpu::q8_linear", "pie_cpu::q5_linear")),
    ("linear: w8a8 quantise and finish (pie kernels)", ("pie_cpu::w8a8",)),
    ("linear: torch int4 kernel", ("_weight_int4pack_mm",)),
    ("linear: int8 (torch._int_mm / fbgemm)", ("_int_mm", "quantized::linear")),
    ("linear: dense / outliers (mm, addmm, linear)", ("aten::mm", "aten::addmm", "aten::linear", "mkldnn::")),
    ("attention (bmm, softmax, sdpa, gathers)", ("aten::bmm", "aten::matmul", "softmax", "scaled_dot", "index_select")),
    ("norms, rope, activations, casts, adds", ()),
)


def _group(name: str) -> str:
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    return GROUPS[-1][0]


def _record(engine: Engine) -> list[ForwardBatch]:
    batcher = next(iter(engine.models.values())).batcher
    seen: list[ForwardBatch] = []
    forward = batcher._forward

    def recording(batch: ForwardBatch) -> Any:
        seen.append(batch)
        return forward(batch)

    batcher._forward = recording
    return seen


def _decode_batch(seen: list[ForwardBatch], size: int) -> ForwardBatch:
    for b in seen:
        if len(b.token_ids) == size and len(b.qo_indptr) == size + 1:
            return b
    raise SystemExit(f"no pure decode batch of {size} requests was recorded")


def profile(engine: Engine, batch: ForwardBatch, repeats: int, rows: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = next(iter(engine.models.values()))

    def replay(backend: BackendCalls) -> tuple[list[float], Any]:
        for _ in range(3):
            backend.forward(batch)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            backend.forward(batch)
            times.append(time.perf_counter() - start)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            backend.forward(batch)
        return times, prof

    # on the backend's own thread, where the engine runs every batch (pie_core.backend.backend_thread)
    times, prof = model.worker.call(replay)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    groups: dict[str, float] = {}
    for e in events:
        groups[_group(e.key)] = groups.get(_group(e.key), 0.0) + e.self_cpu_time_total
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]
    return {
        "tokens": len(batch.token_ids),
        "step_ms_median": 1e3 * statistics.median(times),
        "step_ms_min": 1e3 * min(times),
        "profiled_ops_ms": total / 1e3,
        "op_calls": sum(e.count for e in events),
        "groups_ms": {g: v / 1e3 for g, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ops": [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in top],
        "threads": torch.get_num_threads(),
    }


def render(name: str, p: dict[str, Any]) -> str:
    out = [
        f"### {name}: {p['tokens']} token(s) per step",
        f"step wall time: median {p['step_ms_median']:.1f} ms, min {p['step_ms_min']:.1f} ms "
        f"({p['threads']} threads); under the profiler: {p['op_calls']} op calls, {p['profiled_ops_ms']:.1f} ms of op self time",
        "",
        "| group | ms | share |",
        "|---|---:|---:|",
    ]
    out += [f"| {g} | {ms:.2f} | {100 * ms / p['profiled_ops_ms']:.0f}% |" for g, ms in p["groups_ms"].items()]
    out += ["", "| op | calls | self ms |", "|---|---:|---:|"]
    out += [f"| `{k}` | {n} | {ms:.2f} |" for k, n, ms in p["top_ops"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--extra", default="{}", help="torch backend options as JSON (see pie_backend_torch.options)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=20, help="timed replays per batch (median reported)")
    ap.add_argument("--rows", type=int, default=12, help="ops listed per batch")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    extra = {"threads": args.threads, **json.loads(args.extra)}
    log("loading the torch backend")
    engine = Engine("torch", options=BackendOptions(device="cpu", dtype=args.dtype, extra=extra))
    engine.load(None)
    seen = _record(engine)
    engine_batch1(engine, PROMPTS[0], 4)
    engine_concurrent(engine, PROMPTS[: args.concurrency], 3)
    result: dict[str, Any] = {"machine": machine(), "options": {"dtype": args.dtype, **extra}}
    for name, size in (("batch 1", 1), (f"batch {args.concurrency}", args.concurrency)):
        log(f"replaying {name}")
        result[name] = profile(engine, _decode_batch(seen, size), args.repeats, args.rows)
    m = result["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))
    print(f"options: {result['options']}\n")
    for name in ("batch 1", f"batch {args.concurrency}"):
        print(render(name, result[name]) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    import asyncio

    assert engine.pools_whole()
    asyncio.run(engine.close())
    return 0


if __name__ == "__main__":
    sys.exit(main())
