"""Engine overhead: host time per inferlet-step (SDK + core, backend excluded) on the dummy backend.

    python benchmarks/overhead.py                  # 1, 64 and 512 concurrent generators
    python benchmarks/overhead.py --concurrency 1 64 --steps 16

Each generator decodes ``--steps`` tokens (argmax, no stop) after a short prompt. Host time is
measured two ways, both divided by the inferlet-steps run: the CPU time of the event-loop
thread (SDK + core; the backend runs in its own thread), which a busy machine hardly skews, and
wall time minus the time the backend thread spent in ``pie_backend_forward`` (the batcher's
``backend_seconds``), which also counts waiting for a core. Goal: <= 50 us per inferlet-step at 64
concurrent, and no worse than linear growth to 512.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from inferlet import Context, Model, Sampler, runtime
from pie_core.engine.engine import Engine
from pie_core.runtime.instance import run_main


async def _generator(steps: int) -> None:
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.append([1, 2, 3, 4])
        await ctx.generate(Sampler.argmax(), max_tokens=steps, stop=[], auto_flush=False).collect_tokens()


async def _measure(engine: Engine, n: int, steps: int) -> dict[str, float]:
    stats = engine.models[next(iter(engine.models))].batcher.stats
    backend0, batches0 = stats.backend_seconds, stats.batches
    started, cpu0 = time.perf_counter(), time.thread_time()
    finals = await asyncio.gather(*(run_main(engine, lambda _: _generator(steps), {}, lambda e: None) for _ in range(n)))
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu0
    assert all(f.kind == "return" for f in finals), [f.value for f in finals if f.kind != "return"]
    backend = stats.backend_seconds - backend0
    inferlet_steps = n * steps
    return {
        "concurrent": n,
        "batches": stats.batches - batches0,
        "wall_s": wall,
        "backend_s": backend,
        "host_us_per_inferlet_step": (wall - backend) / inferlet_steps * 1e6,
        "loop_cpu_us_per_inferlet_step": cpu / inferlet_steps * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    engine = Engine("dummy")
    engine.load(None)
    asyncio.run(_measure(engine, 4, 4))  # warm up
    rows = [asyncio.run(_measure(engine, n, args.steps)) for n in args.concurrency]
    base = rows[0]["loop_cpu_us_per_inferlet_step"]
    print("| concurrent | batches | wall s | backend s | loop CPU µs / inferlet-step | vs first row | wall−backend µs / inferlet-step |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['concurrent']} | {r['batches']} | {r['wall_s']:.2f} | {r['backend_s']:.2f} | "
            f"{r['loop_cpu_us_per_inferlet_step']:.1f} | {r['loop_cpu_us_per_inferlet_step'] / base:.2f}× | "
            f"{r['host_us_per_inferlet_step']:.1f} |"
        )


if __name__ == "__main__":
    main()
