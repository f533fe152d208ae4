"""Adapter benchmark: 32 concurrent generators with 0, 1, 4 and 8 distinct LoRA adapters.

Each backend serves the default model (Qwen2.5-Coder-0.5B-Instruct). One inferlet makes the
adapters (rank 8 on every projection, set up with ``zo.initialize`` and moved once by
``zo.update`` so B is not zero), prefills one prompt, forks it into 32 contexts and decodes them
together greedily, context ``i`` with adapter ``i mod k`` (none for k = 0). Each configuration
runs ``--repeats`` times with the order rotated, so that other load on the machine weighs on
them alike; medians are reported:

    python benchmarks/adapters.py                      # torch and cpu
    python benchmarks/adapters.py --backends torch --tokens 16 --repeats 1 --json out.json

Measured per (backend, adapters): decode tok/s (new tokens over the time from the first step's
start to the last step's end, summed over the 32 contexts), the ratio to no adapters from the
same run, and mean requests per batch (all 32 should run as one batch). Goal: 8 adapters at most
15% slower than none (S-LoRA and Punica report 10-20%).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from decode import batcher_delta, batcher_snapshot, log, machine, report  # noqa: E402
from inferlet import Adapter, Context, Model, Sampler, runtime, zo
from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.runtime.instance import run_main

GOAL = 0.85  # tok/s with 8 adapters over tok/s with none
COUNTS = (0, 1, 4, 8)
CONTEXTS = 32
PROMPT = "Write a Python function that parses an ISO 8601 date string and explain each step."


async def _decode(base: Context, last: int, adapter: Adapter | None, n_tok: int) -> tuple[int, float, float]:
    ctx = base.fork()
    ctx.append([last])  # the prompt's last token: every context's first step runs it
    try:
        gen = ctx.generate(Sampler.argmax(), max_tokens=n_tok, stop=[], adapter=adapter, auto_flush=False)
        first = time.perf_counter()
        tokens = await gen.collect_tokens()
        return len(tokens), first, time.perf_counter()
    finally:
        ctx.release()


def _main(counts: list[int], n_tok: int, repeats: int):
    async def main(_: Any) -> dict[str, list[float]]:
        model = Model.load(runtime.models()[0])
        adapters = []
        for i in range(max(counts)):
            a = Adapter.create(model, f"bench-{i}")
            zo.initialize(a, rank=8, alpha=16.0, population_size=2, mu_fraction=0.5, initial_sigma=0.01)
            zo.update(a, [1.0, 0.0], [2 * i + 1, 2 * i + 2], max_sigma=0.02)
            adapters.append(a)
        if adapters:
            await zo.update(adapters[-1], [0.0, 1.0], [101, 102], max_sigma=0.02)  # wait until all are built
        with Context(model) as scratch:
            prompt = scratch.system("You are a helpful assistant.").user(PROMPT).cue().buffer()
        base = Context(model)
        base.append(prompt[:-1])
        await base.flush()
        out: dict[str, list[float]] = {str(k): [] for k in counts}
        for rep in range(repeats):
            order = counts[rep % len(counts):] + counts[: rep % len(counts)]
            for k in order:
                runs = await asyncio.gather(*(
                    _decode(base, prompt[-1], adapters[i % k] if k else None, n_tok) for i in range(CONTEXTS)
                ))
                tokens = sum(r[0] for r in runs)
                span = max(r[2] for r in runs) - min(r[1] for r in runs)
                out[str(k)].append(tokens / span)
                log(f"  {k} adapters: {tokens / span:.1f} tok/s")
        base.release()
        return out

    return main


def run_backend(name: str, counts: list[int], n_tok: int, repeats: int) -> dict[str, Any]:
    log(f"loading {name}")
    engine = Engine(name)
    engine.load(None)
    before = batcher_snapshot(engine)
    events: list[Event] = []
    final = asyncio.run(run_main(engine, _main(counts, n_tok, repeats), {}, events.append))
    if final.kind != "return":
        raise SystemExit(f"{name}: the benchmark inferlet failed: {final.value}")
    batching = batcher_delta(engine, before)
    asyncio.run(engine.close())
    tps = {int(k): statistics.median(v) for k, v in final.value.items()}
    return {"tok_s": tps, "ratio": {k: v / tps[0] for k, v in tps.items()} if 0 in tps else {},
            "runs": final.value, "mean_requests_per_batch": batching["mean_requests_per_batch"]}


def table(results: dict[str, dict[str, Any]], counts: list[int]) -> str:
    lines = ["| backend | adapters | decode tok/s | vs none | requests/batch |", "|---|---|---|---|---|"]
    for backend, r in results.items():
        for k in counts:
            ratio = r["ratio"].get(k)
            lines.append(f"| {backend} | {k} | {r['tok_s'][k]:.1f} | {'' if ratio is None else f'{ratio:.2f}x'} "
                         f"| {r['mean_requests_per_batch']:.1f} |")
    for backend, r in results.items():
        if 8 in r["ratio"]:
            verdict = "met" if r["ratio"][8] >= GOAL else "MISSED"
            lines.append(f"\n{backend}: 8 adapters at {r['ratio'][8]:.2f}x of none (goal >= {GOAL}x): {verdict}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="torch,cpu")
    parser.add_argument("--counts", default=",".join(map(str, COUNTS)), help="adapter counts to compare")
    parser.add_argument("--tokens", type=int, default=32, help="tokens each context decodes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    info = machine()
    log(f"{info['cpu']}, {info['cores']} cores, {info['versions']}")
    results = {b: run_backend(b, counts, args.tokens, args.repeats) for b in args.backends.split(",")}
    report(table(results, counts), {"machine": info, "args": vars(args), "results": results}, args.json)


if __name__ == "__main__":
    sys.exit(main())
