"""Data-parallel replicas on the dummy backend: decode throughput at 1, 2 and 4 replicas, and
the prefix-cache hit rate of a shared-prefix workload placed by the router.

    python benchmarks/scaleout.py                       # the defaults below, a markdown table
    python benchmarks/scaleout.py --step-ms 2 --token-us 500 --clients 64 --steps 32 --json out.json

Throughput: ``--clients`` inferlets start at once on an engine of N replicas (each its own
backend worker thread, page pool, batcher and market, all in this process); each prefills a
distinct 16-token prompt and decodes ``--steps`` tokens one pass at a time. The dummy backend
sleeps ``step_ms`` per batch plus ``token_us`` per input token of the batch (its sleep releases
the GIL, as a device's kernels would): a compute-bound device, whose step grows with the tokens
it runs, so splitting the clients over replicas shortens every replica's steps. Reported:
tokens sampled per second of wall time, and the ratio to one replica.

Prefix hit rate: ``--prefixes`` shared prefixes of ``--prefix-pages`` pages each; ``--requests``
requests, in waves of ``--wave`` at once, each one prefix (drawn at random with ``--seed``; each
recurs many times) plus a distinct 8-token suffix, prefilled with one sampled token. The hit
rate is the share of the prefixes' tokens that were taken from a prefix cache instead of being
computed (1 - computed prefix tokens / prefix tokens). Compared: one replica; two replicas
placed by the router (free pages, then cached prefix, then load); two replicas placed by load
alone (the router without the prompt, as a launched inferlet is). The goal is router >= 0.9x
one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from importlib.metadata import version
from typing import Any

import numpy as np

from pie_core.engine.engine import Engine
from pie_core.engine.placement import Demand, prompt_keys
from pie_core.hookspec import BackendOptions
from pie_core.host import context as host_context
from pie_core.host.binding import HostInstance
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
from pie_core.values import SampleSpec

PAGE_SIZE = 16


def _engine(replicas: int, args: argparse.Namespace, pages: int) -> tuple[Engine, str]:
    extra = {"step_ms": args.step_ms, "token_us": args.token_us}
    engine = Engine("dummy", options=BackendOptions(page_size=PAGE_SIZE, kv_pages=pages, extra=extra), replicas=replicas)
    return engine, engine.load(None).name


async def _run(engine: Engine, name: str, prompt: list[int], steps: int, demand: Demand | None) -> None:
    async def main(_: Any) -> None:
        ctx = host_context.create(name)
        await forward(ctx, prompt, samples=[SampleSpec(index=len(prompt) - 1)])
        for _step in range(steps - 1):
            await forward(ctx, [prompt[-1]], samples=[SampleSpec(index=0)])
        ctx.release()

    inst = HostInstance(engine=engine, emit=lambda event: None, demand=demand)
    final = await run_main(engine, main, {}, lambda event: None, instance=inst)
    if final.kind != "return":
        raise RuntimeError(f"an inferlet failed: {final.value}")


def throughput(replicas: int, args: argparse.Namespace) -> float:
    """Tokens sampled per second with ``args.clients`` decoders on ``replicas`` replicas."""
    engine, name = _engine(replicas, args, pages=args.clients * (1 + (16 + args.steps) // PAGE_SIZE) + 8)

    async def main() -> float:
        await _run(engine, name, [1] * 16, 2, None)  # warm-up: batcher tasks, first batch
        start = time.perf_counter()
        await asyncio.gather(*(_run(engine, name, [1000 + c] * 16, args.steps, None) for c in range(args.clients)))
        seconds = time.perf_counter() - start
        await engine.close()
        return args.clients * args.steps / seconds

    rate = asyncio.run(main())
    assert engine.pools_whole(), "pages were left allocated"
    return rate


def hit_rate(replicas: int, routed: bool, args: argparse.Namespace) -> float:
    """The share of shared-prefix tokens taken from a prefix cache."""
    engine, name = _engine(replicas, args, pages=args.pool_pages)
    plen = args.prefix_pages * PAGE_SIZE
    prefixes = [[10_000 + 1000 * p + i for i in range(plen)] for p in range(args.prefixes)]
    draws = np.random.default_rng(args.seed).integers(args.prefixes, size=args.requests)
    prompts = [prefixes[k] + [50_000 + 8 * i + j for j in range(8)] for i, k in enumerate(draws)]

    async def main() -> int:
        for start in range(0, len(prompts), args.wave):
            wave = prompts[start : start + args.wave]
            demands = [Demand(pages=-(-(len(p) + 1) // PAGE_SIZE), keys=prompt_keys(p, PAGE_SIZE) if routed else ())
                       for p in wave]
            await asyncio.gather(*(_run(engine, name, p, 1, d) for p, d in zip(wave, demands)))
        await engine.close()
        return sum(r.batcher.stats.tokens for r in engine.all_replicas())

    computed = asyncio.run(main())
    assert engine.pools_whole(), "pages were left allocated"
    suffix_tokens = 8 * len(prompts)  # always computed: distinct per request
    prefix_tokens = plen * len(prompts)
    return 1.0 - (computed - suffix_tokens) / prefix_tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step-ms", type=float, default=2.0, help="dummy: fixed milliseconds per batch")
    p.add_argument("--token-us", type=float, default=500.0, help="dummy: microseconds per input token of a batch")
    p.add_argument("--clients", type=int, default=64, help="decoders started at once (throughput)")
    p.add_argument("--steps", type=int, default=32, help="tokens each decoder samples")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4], help="replica counts to measure")
    p.add_argument("--prefixes", type=int, default=8, help="shared prefixes (hit rate)")
    p.add_argument("--prefix-pages", type=int, default=4, help="pages of each shared prefix")
    p.add_argument("--requests", type=int, default=64, help="requests of the shared-prefix workload")
    p.add_argument("--wave", type=int, default=8, help="requests started at once")
    p.add_argument("--seed", type=int, default=0, help="seed of the prefix draws")
    p.add_argument("--pool-pages", type=int, default=256, help="KV pages per replica (hit rate)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)

    rates = {n: throughput(n, args) for n in args.replicas}
    base = rates[args.replicas[0]]
    one = hit_rate(1, True, args)
    routed = hit_rate(2, True, args)
    by_load = hit_rate(2, False, args)

    print(f"dummy backend: step_ms={args.step_ms:g}, token_us={args.token_us:g}; {args.clients} clients x "
          f"{args.steps} tokens; python {platform.python_version()}, numpy {version('numpy')}, "
          f"pie {version('pie-engine') if _installed('pie-engine') else 'checkout'}\n")
    print("| replicas | tokens/s | vs 1 replica |")
    print("|---:|---:|---:|")
    for n, rate in rates.items():
        print(f"| {n} | {rate:,.0f} | {rate / base:.2f}x |")
    print(f"\nshared-prefix workload: {args.prefixes} prefixes x {args.prefix_pages} pages, {args.requests} requests "
          f"in waves of {args.wave}\n")
    print("| placement | prefix hit rate | vs 1 replica |")
    print("|---|---:|---:|")
    for label, rate in (("1 replica", one), ("2 replicas, router", routed), ("2 replicas, load only", by_load)):
        print(f"| {label} | {rate:.3f} | {rate / one:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "throughput": rates, "hit_rate": {"one": one, "routed": routed,
                                                                             "load_only": by_load}}, f, indent=1)
    return 0


def _installed(dist: str) -> bool:
    try:
        version(dist)
    except Exception:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
