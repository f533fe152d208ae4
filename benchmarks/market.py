"""KV-page market benchmark: N long generators on a pool of K pages that holds a third of them.

N concurrent inferlets each prefill a distinct prompt and decode ``--max-tokens`` greedy tokens
(``stop=[]``: exactly that many), so that together their contexts need about 3 x K pages at the
end. Half bid high and half bid low: each calls ``ctx.set_bid(bid)`` before every step
(``set_bid`` holds for one pass). Inferlet ``i`` is high when ``i`` is even, so both classes are
spread over the launch order. All are launched at once, in one process, with
``asyncio.gather`` over ``run_main``. Three configurations in one run:

* ``market`` - the engine as it is: pool K; contexts that lose the auction are suspended
  (copied to the host pool, or dropped and replayed) and come back later.
* ``first-come`` - the behaviour before the market, emulated: a pass that cannot get its pages
  at once fails with ``OutOfPages`` (see :func:`_first_come_admit`); the inferlet fails.
* ``unlimited`` - the same work on a pool of 4 x K pages: everyone fits.

    python benchmarks/market.py                         # dummy backend, K=64, N=16
    python benchmarks/market.py --step-ms 20 --repeats 5 --json market.json
    python benchmarks/market.py --backend cpu           # the default model: K=48, N=8, 64 tokens

The dummy backend has no compute to speak of (~2.5 ms per batch of 16), so by default each
batch also sleeps ``--step-ms`` + ``--token-us`` per token in the backend thread (a GPU-like
step: a fixed cost plus a small one per token, which makes replays and prefill cost time) and
each page copy ``--copy-us``: the dummy's ``step_ms``, ``token_us`` and ``copy_us`` backend
options (``pie run --dummy --backend-option step_ms=10`` does the same). The cpu backend takes
the time it takes.

Measured per configuration: completed and failed inferlets, decode tok/s (tokens of completed
inferlets over the wall time from launch to the last finish), p50/p99 latency (launch to
finish) of completed inferlets per bid class, batches and mean requests per batch, the market's
suspensions and replays, how full the pool was, and (while both classes are live) the high
class's share of the held pages and how often a high bidder was off the device while a low one
held pages ("inverted ticks"). It also prints the fewest batches any schedule on K pages needs
(each pass holds its context's pages), which bounds the tok/s ratio when a batch costs the same
however many requests it holds. Every run checks that the page and host pools are whole
afterwards (``engine.pools_whole()``) and that credit is conserved
(``market.ledger.conserved()``). With ``--repeats`` the configurations run in rotated order and
medians are reported.

Goals: market tok/s / unlimited tok/s >= 0.8; high-bid p50 / low-bid p50 under the market
<= 0.6; no failed inferlet under the market.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import time
from typing import Any

import numpy as np

from decode import batcher_delta, batcher_snapshot, log, machine, report  # noqa: E402
from inferlet import Context, Model, Sampler, runtime
from pie_core.engine.engine import Engine, LoadedModel
from pie_core.engine.events import Event
from pie_core.errors import OutOfPages
from pie_core.hookspec import BackendOptions
from pie_core.runtime.instance import run_main
from pie_core.scheduler.market import Grant, Holder, Market

GOAL_TPS = 0.8  # market tok/s over unlimited tok/s
GOAL_PRIORITY = 0.6  # high-bid p50 latency over low-bid p50 latency, under the market
CONFIGS = ("market", "first-come", "unlimited")
HIGH, LOW = "high", "low"
WORDS = (
    "cache page token batch queue tensor kernel layer prompt decode prefill context bid rent "
    "credit auction pool host device copy replay suspend restore lineage adapter sampler probe "
    "vector matrix stream window budget tick latency throughput schedule market holder"
).split()


async def _first_come_admit(self: Market, holder: Holder, new: int) -> Grant:
    """``Market.admit`` as the engine behaved before the market (installed on one instance).

    Then a pass took the pages it needed from the pool at once or failed with OutOfPages, and
    no context was ever suspended. So: grant when the pool has ``new`` pages, else raise.
    Nothing waits here, so no auction runs and nothing is suspended (the ``resident`` test is
    only a guard). The inferlet does not catch the error: it fails, and counts as failed.
    """
    if not holder.kv.resident or self.pool.available_count < new:
        raise OutOfPages(f"first-come: {new} KV pages wanted, {self.pool.available_count} available")
    return self._grant(holder, new)  # the pass reads the grant (a replay to run first, if any)


def prompts(model: LoadedModel, n: int, length: int, run: int) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``length`` token ids, different in every run, so that the
    prefix cache shares no page between generators or with an earlier run."""
    out = []
    for i in range(n):
        rng = random.Random(run * 1_000_003 + i)
        ids: list[int] = model.tokenizer.encode(f"Run {run}, request {i}: summarise these notes.")
        while len(ids) < length:
            ids += model.tokenizer.encode(" " + " ".join(rng.choice(WORDS) for _ in range(32)))
        out.append(ids[:length])
    return out


def _generator(prompt: list[int], bid: float, max_tokens: int, cls: str, classes: dict[Holder, str]):
    async def main(_: Any) -> int:
        model = Model.load(runtime.models()[0])
        ctx = Context(model)
        classes[ctx._handle().holder] = cls  # the benchmark's instrumentation reads the class
        ctx.append(prompt)
        gen = ctx.generate(Sampler.argmax(), max_tokens=max_tokens, stop=[], auto_flush=False)
        async for step in gen:
            ctx.set_bid(bid)  # for this pass only: set again before every step
            await step.execute()
        ctx.release()
        return gen.tokens_generated

    return main


class Probe:
    """Counts, per bid class, suspensions, replays and host restores, and at each tick the pages
    held (wraps three methods of one Market instance; :meth:`remove` takes them off).

    ``high_page_share`` and ``inverted_ticks`` count only ticks while both classes have a live
    context: over the whole run each class holds the same page-ticks, whoever goes first.
    """

    def __init__(self, market: Market, classes: dict[Holder, str]) -> None:
        self.market = market
        self.suspended = {HIGH: 0, LOW: 0}
        self.replayed = {HIGH: 0, LOW: 0}
        self.restored = {HIGH: 0, LOW: 0}
        self.ticks = self.used = 0  # ticks, and pages held summed over them
        self.both = self.both_used = self.high_used = 0  # the same over ticks with both classes live
        self.inverted = 0  # ticks at which a high bidder was off the device and a low one on it
        suspend, grant, tick = market.suspend, market._grant, market.tick

        def counted_suspend(holder: Holder) -> bool:
            moved = suspend(holder)
            if moved and holder in classes:
                self.suspended[classes[holder]] += 1
            return moved

        def counted_grant(holder: Holder, new: int) -> Grant:
            was_resident = holder.kv.resident
            granted = grant(holder, new)
            if not was_resident and holder in classes:
                (self.replayed if granted.replay_from is not None else self.restored)[classes[holder]] += 1
            return granted

        def counted_tick(seconds: float) -> None:
            tick(seconds)
            held, off, live = {HIGH: 0, LOW: 0}, {HIGH: 0, LOW: 0}, set()
            for holder, cls in classes.items():
                if not holder.kv.released:
                    live.add(cls)
                    if holder.kv.resident:
                        held[cls] += len(holder.kv.pages)
                    else:
                        off[cls] += 1
            self.ticks += 1
            self.used += held[HIGH] + held[LOW]
            if len(live) == 2:
                self.both += 1
                self.both_used += held[HIGH] + held[LOW]
                self.high_used += held[HIGH]
                self.inverted += held[LOW] > 0 and off[HIGH] > 0

        market.suspend, market._grant, market.tick = counted_suspend, counted_grant, counted_tick  # type: ignore[method-assign]

    def remove(self) -> None:
        for name in ("suspend", "_grant", "tick"):
            self.market.__dict__.pop(name, None)

    def summary(self) -> dict[str, Any]:
        return {
            "suspended": dict(self.suspended),
            "replayed": dict(self.replayed),
            "restored": dict(self.restored),
            "pool_use": self.used / self.ticks / self.market.pool.num_pages if self.ticks else 0.0,
            "high_page_share": self.high_used / self.both_used if self.both_used else math.nan,
            "inverted_ticks": self.inverted / self.both if self.both else math.nan,
        }


def run_config(engine: Engine, config: str, run: int, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration once: launch the N generators together and measure them."""
    model = next(iter(engine.models.values()))
    market = model.market
    ps = prompts(model, args.generators, args.prompt_tokens, run)
    bids = {HIGH: args.high_bid, LOW: args.low_bid}
    classes: dict[Holder, str] = {}
    probe = Probe(market, classes)
    if config == "first-come":
        market.admit = _first_come_admit.__get__(market)  # type: ignore[method-assign]
    before = batcher_snapshot(engine)
    suspensions, replays = market.suspensions, market.replays

    async def one(i: int, t0: float) -> dict[str, Any]:
        cls = HIGH if i % 2 == 0 else LOW
        events: list[Event] = []
        final = await run_main(engine, _generator(ps[i], bids[cls], args.max_tokens, cls, classes), {}, events.append)
        ok = final.kind == "return"
        return {"class": cls, "ok": ok, "tokens": final.value if ok else 0, "latency": time.perf_counter() - t0,
                "error": None if ok else str(final.value)}

    async def everyone() -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        return await asyncio.gather(*(one(i, t0) for i in range(args.generators)))

    try:
        started = time.perf_counter()
        requests = asyncio.run(everyone())
        wall = time.perf_counter() - started
    finally:
        market.__dict__.pop("admit", None)
        probe.remove()
    held, should = market.ledger.conserved()
    whole = engine.pools_whole()
    if not whole or not math.isclose(held, should, rel_tol=1e-9, abs_tol=1e-6):
        raise SystemExit(f"{config}: pools whole: {whole}; credit held {held} vs {should} (must be equal)")
    done = [r for r in requests if r["ok"]]
    errors = sorted({r["error"].split(":")[0] for r in requests if not r["ok"]})
    out: dict[str, Any] = {
        "completed": len(done),
        "failed": len(requests) - len(done),
        "errors": errors,
        "tok_s": sum(r["tokens"] for r in done) / wall,
        "wall_s": wall,
        "suspensions": market.suspensions - suspensions,
        "replays": market.replays - replays,
        "batching": batcher_delta(engine, before),
        "classes": probe.summary(),
        "pools_whole": whole,
        "credit": [held, should],
    }
    for cls in (HIGH, LOW):
        lat = [r["latency"] for r in done if r["class"] == cls]
        out[f"{cls}_p50"] = float(np.percentile(lat, 50)) if lat else math.nan
        out[f"{cls}_p99"] = float(np.percentile(lat, 99)) if lat else math.nan
    out["finish_order"] = "".join(r["class"][0] for r in sorted(done, key=lambda r: r["latency"]))
    return out


def make_engine(args: argparse.Namespace, pages: int) -> Engine:
    dtype = "float32" if args.backend == "dummy" else "auto"  # "auto": each backend's best precision
    options = BackendOptions(dtype=dtype, kv_pages=pages, page_size=args.page_size, host_pages=args.host_pages,
                             extra=dummy_timing(args) if args.backend == "dummy" else {})
    engine = Engine(args.backend, options=options)
    log(f"loading the default model on {args.backend} with {pages} KV pages")
    engine.load(None)
    return engine


def dummy_timing(args: argparse.Namespace) -> dict[str, float]:
    """The dummy backend's timing options (``pie_core.backend_kit.dummy``) from ``--step-ms``,
    ``--token-us`` and ``--copy-us``."""
    return {"step_ms": args.step_ms, "token_us": args.token_us, "copy_us": args.copy_us}


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the numeric fields over repeats (the last run's for the rest)."""
    out = dict(runs[-1])
    for key in ("completed", "failed", "tok_s", "wall_s", "high_p50", "high_p99", "low_p50", "low_p99",
                "suspensions", "replays"):
        out[key] = statistics.median(r[key] for r in runs)
    out["requests_per_batch"] = statistics.median(r["batching"]["mean_requests_per_batch"] for r in runs)
    out["batches"] = statistics.median(r["batching"]["batches"] for r in runs)
    for key in ("high_page_share", "pool_use", "inverted_ticks"):
        out[key] = statistics.median(r["classes"][key] for r in runs)
    return out


def table(results: dict[str, dict[str, Any]], pools: dict[str, int]) -> str:
    lines = [
        "| config | pool | completed | failed | decode tok/s | high p50 s | high p99 s | low p50 s | low p99 s "
        "| batches | req/batch | pool use | suspensions (high/low) | replays | high page share | inverted ticks |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, r in results.items():
        per_class = r["classes"]["suspended"]  # the last run's
        lines.append(
            f"| {config} | {pools[config]} | {r['completed']:g} | {r['failed']:g} | {r['tok_s']:.1f} "
            f"| {r['high_p50']:.2f} | {r['high_p99']:.2f} | {r['low_p50']:.2f} | {r['low_p99']:.2f} "
            f"| {r['batches']:g} | {r['requests_per_batch']:.1f} | {r['pool_use']:.2f} "
            f"| {r['suspensions']:g} ({per_class[HIGH]}/{per_class[LOW]}) | {r['replays']:g} "
            f"| {r['high_page_share']:.2f} | {r['inverted_ticks']:.2f} |"
        )
    return "\n".join(lines)


def fewest_batches(args: argparse.Namespace) -> int:
    """The fewest batches that run every pass on K pages: pass j of a context (j = 1 is the
    prompt) holds ceil((prompt + j - 1) / page_size) pages, and a batch holds at most K."""
    held = sum(-(-(args.prompt_tokens + j - 1) // args.page_size) for j in range(1, args.max_tokens + 1))
    return max(args.max_tokens, -(-args.generators * held // args.pages))


def verdicts(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> tuple[str, dict[str, float]]:
    m, u = results.get("market"), results.get("unlimited")
    ratios: dict[str, float] = {}
    bound = fewest_batches(args)
    lines = [f"fewest batches on K={args.pages} pages: {bound}, against {args.max_tokens} with room for all; "
             f"at a fixed cost per batch, market / unlimited tok/s is at most about {args.max_tokens / bound:.2f}"]
    if m and u:
        ratios["market_over_unlimited_tok_s"] = m["tok_s"] / u["tok_s"]
        ok = ratios["market_over_unlimited_tok_s"] >= GOAL_TPS
        lines.append(f"market tok/s / unlimited tok/s: {ratios['market_over_unlimited_tok_s']:.2f} "
                     f"(goal >= {GOAL_TPS}): {'met' if ok else 'MISSED'}")
    if m:
        ratios["high_p50_over_low_p50"] = m["high_p50"] / m["low_p50"]
        ok = ratios["high_p50_over_low_p50"] <= GOAL_PRIORITY
        lines.append(f"market high-bid p50 / low-bid p50: {ratios['high_p50_over_low_p50']:.2f} "
                     f"(goal <= {GOAL_PRIORITY}): {'met' if ok else 'MISSED'}")
        lines.append(f"market failures: {m['failed']:g} (goal 0): {'met' if m['failed'] == 0 else 'MISSED'}")
    if "first-come" in results:
        fc = results["first-come"]
        lines.append(f"first-come failures: {fc['failed']:g} of {fc['completed'] + fc['failed']:g}")
    return "\n".join(lines), ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="dummy", help="dummy (default) or cpu (the default model)")
    parser.add_argument("--pages", type=int, help="K, the pool of the market and first-come runs (dummy 64, cpu 48)")
    parser.add_argument("--generators", type=int, help="N concurrent inferlets (dummy 16, cpu 8)")
    parser.add_argument("--max-tokens", type=int, help="tokens each decodes (dummy 144, cpu 64)")
    parser.add_argument("--prompt-tokens", type=int,
                        help="prompt length (default: so that the N contexts need about 3 x K pages at the end)")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--host-pages", type=int, default=0, help="host pool pages (0: the backend's default)")
    parser.add_argument("--high-bid", type=float, default=1.0, help="credits per page per tick, the high class")
    parser.add_argument("--low-bid", type=float, default=0.1, help="credits per page per tick, the low class")
    parser.add_argument("--step-ms", type=float, default=10.0, help="dummy: added time per batch")
    parser.add_argument("--token-us", type=float, default=20.0, help="dummy: added time per batch token")
    parser.add_argument("--copy-us", type=float, default=10.0, help="dummy: added time per copied page")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--repeats", type=int, help="runs per configuration, order rotated (dummy 3, cpu 1)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    cpu = args.backend != "dummy"
    args.pages = args.pages or (48 if cpu else 64)
    args.generators = args.generators or (8 if cpu else 16)
    args.max_tokens = args.max_tokens or (64 if cpu else 144)
    args.repeats = args.repeats or (1 if cpu else 3)
    if args.prompt_tokens is None:  # N * (prompt + max_tokens) / page_size = 3 * K
        args.prompt_tokens = max(args.page_size, 3 * args.pages * args.page_size // args.generators - args.max_tokens)
    configs = args.configs.split(",")
    need = args.generators * -(-(args.prompt_tokens + args.max_tokens) // args.page_size)
    info = machine()
    log(f"{info['cpu']}, {info['cores']} cores, {info['versions']}, load average {info['loadavg_start']:.2f}")
    log(f"K={args.pages} pages of {args.page_size}, N={args.generators} generators of {args.prompt_tokens} + "
        f"{args.max_tokens} tokens: {need} pages at the end ({need / args.pages:.1f} x K)")
    pools = {c: 4 * args.pages if c == "unlimited" else args.pages for c in configs}
    engines = {p: make_engine(args, p) for p in sorted(set(pools.values()))}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for rep in range(args.repeats):
        order = configs[rep % len(configs):] + configs[: rep % len(configs)]
        for config in order:
            r = run_config(engines[pools[config]], config, rep * len(configs) + configs.index(config), args)
            runs[config].append(r)
            log(f"  {config}: {r['completed']} done, {r['failed']} failed, {r['tok_s']:.1f} tok/s, "
                f"p50 high {r['high_p50']:.2f} s low {r['low_p50']:.2f} s, {r['suspensions']} suspensions, "
                f"{r['replays']} replays, finish order {r['finish_order']}")
    for engine in engines.values():
        asyncio.run(engine.close())
    results = {c: median(v) for c, v in runs.items()}
    text, ratios = verdicts(results, args)
    report(table(results, pools) + "\n\n" + text + "\n\npools whole and credit conserved after every run",
           {"machine": info, "args": vars(args), "results": results, "runs": runs, "ratios": ratios}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
