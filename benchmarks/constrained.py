"""Constrained-decoding benchmark: JSON-schema-constrained vs unconstrained decode, one run.

Both variants run on the engine's cpu backend with the default model (Qwen2.5-Coder-0.5B-
Instruct), greedy, on the same prompts, and generate exactly the same number of tokens: the
schema asks for at least 200 array items, so the grammar cannot end before ``--tokens`` and
the unconstrained side runs with ``stop=[]``. The variants are measured alternately, phase by
phase, so other load on the machine weighs on both alike.

    python benchmarks/constrained.py                # 48 new tokens, batch 1 (median of 3) and 16 concurrent
    python benchmarks/constrained.py --quick        # smoke check: 12 tokens, 4 concurrent, one repeat
    python benchmarks/constrained.py --json out.json

Measured:

* decode tok/s at batch 1 (first to last generated token, prefill excluded, per-step stamps)
  and at N concurrent inferlets (tokens after each one's first over the span from the first
  first-token to the last token, i.e. the decode phase of the whole batch);
* per generated token, the time the generator spends on constraints: filling the next mask
  (xgrammar) and advancing over the sampled token, timed inside the SDK's constraint set;
* the first compilation of the schema (off the event loop) and the cache hit after it.

The ratio constrained / unconstrained is the number that counts (goal >= 0.9 at both batch
sizes); absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import PROMPTS, log, machine  # noqa: E402

from inferlet import Context, JsonSchema, Model, Sampler, runtime  # noqa: E402
from inferlet.constraints import ConstraintSet  # noqa: E402
from pie_core.engine.engine import Engine  # noqa: E402
from pie_core.engine.events import Event  # noqa: E402
from pie_core.runtime.instance import run_main  # noqa: E402

GOAL = 0.9

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 0, "maximum": 999},
                    "tags": {"type": "array", "items": {"enum": ["new", "sale", "bulk"]}, "maxItems": 2},
                },
                "required": ["name", "qty"],
            },
        }
    },
    "required": ["items"],
}


class ConstraintClock:
    """Wraps the SDK's ConstraintSet to time mask fills and token advances."""

    def __init__(self) -> None:
        self.fills: list[float] = []
        self.accept_s = 0.0
        self.accepts = 0
        self._mask = ConstraintSet.mask
        self._accept = ConstraintSet.accept

    def install(self) -> None:
        clock = self

        def mask(self: ConstraintSet) -> Any:
            fresh = self._mask is not None and self._mask.size == 0  # _UNSET: a fill happens now
            t = time.perf_counter()
            out = clock._mask(self)
            if fresh:
                clock.fills.append(time.perf_counter() - t)
            return out

        def accept(self: ConstraintSet, token: int) -> None:
            t = time.perf_counter()
            clock._accept(self, token)
            clock.accept_s += time.perf_counter() - t
            clock.accepts += 1

        ConstraintSet.mask = mask  # type: ignore[method-assign]
        ConstraintSet.accept = accept  # type: ignore[method-assign]

    def reset(self) -> None:
        self.fills = []
        self.accept_s = 0.0
        self.accepts = 0

    def per_token_us(self) -> dict[str, float]:
        fills = [1e6 * f for f in self.fills] or [0.0]
        fill = statistics.fmean(fills)
        step = 1e6 * self.accept_s / max(self.accepts, 1)
        return {"mask_fill_us": fill, "mask_fill_p50_us": statistics.median(fills), "mask_fill_max_us": max(fills),
                "accept_us": step, "total_us": fill + step, "masks": len(self.fills)}


def _main(prompt: str, max_tokens: int, constrained: bool):
    async def main(_: dict[str, Any]) -> dict[str, Any]:
        with Context(Model.load(runtime.models()[0])) as ctx:
            ctx.user(prompt)
            kw: dict[str, Any] = {"constrain": JsonSchema(SCHEMA)} if constrained else {"stop": []}
            g = ctx.generate(Sampler.argmax(), max_tokens=max_tokens, **kw)
            stamps: list[float] = []
            tokens: list[int] = []
            async for step in g:
                tokens.extend((await step.execute()).tokens)
                stamps.append(time.perf_counter())
            text = Model.load(runtime.models()[0]).tokenizer().decode(tokens)
        return {"stamps": stamps, "tokens": len(tokens), "text": text}

    return main


async def _run(engine: Engine, main: Any) -> dict[str, Any]:
    events: list[Event] = []
    final = await run_main(engine, main, {}, events.append)
    if final.kind != "return":
        raise RuntimeError(f"inferlet failed: {final.value}")
    return final.value  # type: ignore[no-any-return]


def batch1(engine: Engine, prompt: str, tokens: int, constrained: bool) -> dict[str, Any]:
    out = asyncio.run(_run(engine, _main(prompt, tokens, constrained)))
    stamps = out["stamps"]
    out["decode_tps"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return out


def concurrent(engine: Engine, prompts: list[str], tokens: int, constrained: bool) -> dict[str, Any]:
    async def all_of_them() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_run(engine, _main(p, tokens, constrained)) for p in prompts))

    outs = asyncio.run(all_of_them())
    first = min(o["stamps"][0] for o in outs)
    last = max(o["stamps"][-1] for o in outs)
    decoded = sum(len(o["stamps"]) - 1 for o in outs)
    return {"decode_tps": decoded / (last - first), "tokens": sum(o["tokens"] for o in outs),
            "sample": outs[0]["text"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke check: 12 tokens, 4 concurrent, one repeat")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--tokens", type=int, help="new tokens per request (default 48; 12 with --quick)")
    ap.add_argument("--concurrency", type=int, help="concurrent requests (default 16; 4 with --quick)")
    ap.add_argument("--repeats", type=int, help="batch-1 repeats, median reported (default 3; 1 with --quick)")
    args = ap.parse_args(argv)
    tokens = args.tokens or (12 if args.quick else 48)
    n = args.concurrency or (4 if args.quick else 16)
    repeats = args.repeats or (1 if args.quick else 3)
    prompt = "List items in a shop inventory as JSON."
    prompts = [f"List items for this request as JSON: {p}" for p in (PROMPTS * 2)[:n]]

    result: dict[str, Any] = {"machine": machine(), "tokens": tokens, "concurrency": n, "repeats": repeats}
    log(f"machine: {result['machine']['cpu']}, load average {result['machine']['loadavg_start']:.2f}")
    engine = Engine("cpu")
    t = time.perf_counter()
    engine.load(None)
    log(f"engine: loaded in {time.perf_counter() - t:.1f}s")
    clock = ConstraintClock()
    clock.install()

    t = time.perf_counter()
    warm = batch1(engine, prompt, 2, True)  # the first constrained run compiles the schema
    result["first_compile_and_run_s"] = time.perf_counter() - t
    t = time.perf_counter()
    batch1(engine, prompt, 2, True)
    result["cached_run_s"] = time.perf_counter() - t
    batch1(engine, prompt, 2, False)
    log(f"warm-up done (first constrained run incl. compile: {result['first_compile_and_run_s']:.2f}s; {warm['text']!r})")

    runs: dict[str, list[dict[str, Any]]] = {"free": [], "json": []}
    clock.reset()
    for r in range(repeats):
        for kind in ("free", "json"):
            runs[kind].append(batch1(engine, prompt, tokens, kind == "json"))
            log(f"batch 1 {kind} #{r + 1}: {runs[kind][-1]['decode_tps']:.2f} tok/s")
    result["mask_batch1"] = clock.per_token_us()
    result["batch1"] = {k: statistics.median(x["decode_tps"] for x in v) for k, v in runs.items()}
    result["batch1_sample"] = runs["json"][0]["text"]

    clock.reset()
    many = {}
    for kind in ("free", "json"):
        many[kind] = concurrent(engine, prompts, tokens, kind == "json")
        log(f"{n} concurrent {kind}: {many[kind]['decode_tps']:.2f} tok/s")
    result["mask_batchN"] = clock.per_token_us()
    result["batchN"] = {k: v["decode_tps"] for k, v in many.items()}
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    asyncio.run(engine.close())

    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    rows = [
        ("batch 1, decode tok/s", r["batch1"]),
        (f"{r['concurrency']} concurrent, decode tok/s", r["batchN"]),
    ]
    lines = [
        f"{r['tokens']} new tokens per request, greedy; batch 1 median of {r['repeats']}. "
        f"1-min load average {m['loadavg_start']:.2f} before loading, {m['loadavg_end']:.2f} at the end.",
        "",
        "| measure | unconstrained | JSON schema | ratio | goal |",
        "|---|---:|---:|---:|---|",
    ]
    for name, v in rows:
        ratio = v["json"] / v["free"]
        verdict = "met" if ratio >= GOAL else "missed"
        lines.append(f"| {name} | {v['free']:.2f} | {v['json']:.2f} | **{ratio:.2f}x** | >= {GOAL}x: {verdict} |")
    lines += [
        "",
        "| constraint time per generated token | mask fill (mean / median / max) | advance | total (mean) |",
        "|---|---:|---:|---:|",
    ]
    for name, key in (("batch 1", "mask_batch1"), (f"{r['concurrency']} concurrent", "mask_batchN")):
        t = r[key]
        lines.append(f"| {name} ({t['masks']} masks) | {t['mask_fill_us']:.1f} / {t['mask_fill_p50_us']:.1f} / "
                     f"{t['mask_fill_max_us']:.0f} µs | {t['accept_us']:.1f} µs | {t['total_us']:.1f} µs |")
    lines += ["", f"first constrained run incl. compiling the schema: {r['first_compile_and_run_s']:.2f} s; "
              f"the same run with the compiled schema cached: {r['cached_run_s']:.2f} s",
              f"sample constrained output: {r['batch1_sample'][:120]!r}"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
