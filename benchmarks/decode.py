"""Decode benchmark: the engine's cpu (NumPy) backend vs Hugging Face ``transformers`` fp32.

Both sides run the default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF, dequantised to
float32 on both sides) in one process on the same prompt token ids: the engine's chat format
builds them inside the inferlet, and transformers is fed exactly those ids. Both models are
loaded first and the sides are measured alternately, phase by phase, so that other load on the
machine weighs on both alike.

    python benchmarks/decode.py                 # full run: 32 new tokens, 32 concurrent
    python benchmarks/decode.py --quick         # smoke check: 8 new tokens, 8 concurrent
    python benchmarks/decode.py --skip-transformers --json out.json

Measured, per side:

* batch 1 — one inferlet (``ctx.generate(Sampler.argmax(), ...)``) vs ``generate(do_sample=False)``.
  Decode tok/s counts from the first generated token to the last (prefill excluded), from
  per-step timestamps; end-to-end tok/s is new tokens over the whole call.
* batch N — N concurrent inferlets on one engine vs one left-padded ``generate`` batch. Total
  tok/s is all new tokens over the wall time (prefill included); decode-only tok/s subtracts a
  separate prefill-only run (``max_tokens=1``) from the total, on both sides alike.

Every ratio is engine / transformers from the same run; absolute numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferlet import Context, Model, Sampler, runtime
from pie_core import __version__ as pie_version
from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.runtime.instance import run_main

# Goals this benchmark is held to (engine / transformers fp32, same run).
GOAL_BATCH1_DECODE = 1.0
GOAL_BATCHN_DECODE = 1.5

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does the yield keyword do in Python?",
    "Explain a hash map in two sentences.",
    "Write a SQL query that counts rows per day.",
    "How do I read a file line by line in Rust?",
    "Give a regex that matches an email address.",
    "What is the difference between a list and a tuple?",
    "Write a bash loop over all .txt files.",
    "Explain big-O notation briefly.",
    "Write a JavaScript debounce function.",
    "What is a race condition?",
    "How do I sort a dict by value in Python?",
    "Write a C function that swaps two ints.",
    "What is tail recursion?",
    "Explain git rebase versus git merge.",
    "Write a Python class for a stack.",
    "What is a closure in JavaScript?",
    "How do I make an HTTP GET request in Go?",
    "Write a binary search in Python.",
    "What does 'async' mean in Python?",
    "Explain what a mutex is.",
    "Write a function to check for a palindrome.",
    "What is the CAP theorem?",
    "How do I merge two sorted lists?",
    "Write a Dockerfile for a Flask app.",
    "What is memoization?",
    "Explain the difference between TCP and UDP.",
    "Write a Python generator for Fibonacci numbers.",
    "What is dependency injection?",
    "How do I deep copy an object in Python?",
    "Write a quicksort in Haskell.",
    "What is a virtual environment in Python?",
]


# -- the engine side ------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """One generation: its prompt ids, new tokens, and timestamps (``time.perf_counter``)."""

    prompt: list[int]
    tokens: list[int]
    start: float
    stamps: list[float] = field(default_factory=list)  # after each new token

    @property
    def decode_tps(self) -> float:
        """Tokens after the first over the time from the first to the last (prefill excluded)."""
        span = self.stamps[-1] - self.stamps[0]
        return (len(self.stamps) - 1) / span if span > 0 else float("nan")

    @property
    def e2e_tps(self) -> float:
        return len(self.tokens) / (self.stamps[-1] - self.start)


def _stepping_main(prompt: str, max_tokens: int):
    """An inferlet that generates step by step and timestamps every step."""

    async def main(_: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        with Context(Model.load(runtime.models()[0])) as ctx:
            ctx.user(prompt)
            g = ctx.generate(Sampler.argmax(), max_tokens=max_tokens, stop=[])
            prompt_ids = ctx.buffer()
            tokens: list[int] = []
            stamps: list[float] = []
            async for step in g:
                out = await step.execute()
                tokens.extend(out.tokens)
                stamps.append(time.perf_counter())
        return {"prompt": prompt_ids, "tokens": tokens, "start": start, "stamps": stamps}

    return main


def _collecting_main(prompt: str, max_tokens: int):
    """An inferlet that generates with ``collect_tokens`` (the ordinary way)."""

    async def main(_: dict[str, Any]) -> dict[str, Any]:
        with Context(Model.load(runtime.models()[0])) as ctx:
            ctx.user(prompt)
            g = ctx.generate(Sampler.argmax(), max_tokens=max_tokens, stop=[])
            prompt_ids = ctx.buffer()
            tokens = await g.collect_tokens()
        return {"prompt": prompt_ids, "tokens": tokens}

    return main


async def _run(engine: Engine, main) -> dict[str, Any]:
    events: list[Event] = []
    final = await run_main(engine, main, {}, events.append)
    if final.kind != "return":
        raise RuntimeError(f"inferlet failed: {final.value}")
    return final.value


def engine_batch1(engine: Engine, prompt: str, max_tokens: int) -> Run:
    out = asyncio.run(_run(engine, _stepping_main(prompt, max_tokens)))
    return Run(out["prompt"], out["tokens"], out["start"], out["stamps"])


def engine_concurrent(engine: Engine, prompts: list[str], max_tokens: int) -> tuple[float, list[dict[str, Any]]]:
    """Run one inferlet per prompt concurrently; return (wall seconds, their results)."""

    async def all_of_them() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_run(engine, _collecting_main(p, max_tokens)) for p in prompts))

    started = time.perf_counter()
    results = asyncio.run(all_of_them())
    return time.perf_counter() - started, results


def batcher_delta(engine: Engine, before: dict[str, Any]) -> dict[str, Any]:
    stats = next(iter(engine.models.values())).batcher.stats
    batches = stats.batches - before["batches"]
    requests = stats.requests - before["requests"]
    sizes = {k: v - before["sizes"].get(k, 0) for k, v in stats.sizes.items() if v - before["sizes"].get(k, 0)}
    return {
        "batches": batches,
        "requests": requests,
        "mean_requests_per_batch": requests / batches if batches else 0.0,
        "max_requests_per_batch": max(sizes, default=0),
        "backend_seconds": stats.backend_seconds - before["backend_seconds"],
        "sizes": dict(sorted(sizes.items())),
    }


def batcher_snapshot(engine: Engine) -> dict[str, Any]:
    stats = next(iter(engine.models.values())).batcher.stats
    return {
        "batches": stats.batches,
        "requests": stats.requests,
        "backend_seconds": stats.backend_seconds,
        "sizes": dict(stats.sizes),
    }


# -- the transformers side ------------------------------------------------------------------


class _Stamps:
    """A ``generate`` streamer that timestamps every new token (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if self._prompt_seen:
            self.stamps.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


class HFSide:
    def __init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from pie_core.models.registry import resolve_model

        torch.set_num_threads(2)
        path = resolve_model(None).path
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        self.model.eval()
        self.pad = 151643  # <|endoftext|>, Qwen2's pad token

    def generate(self, prompts: list[list[int]], max_new_tokens: int, streamer: Any = None) -> np.ndarray:
        """Greedy ``generate`` of exactly ``max_new_tokens`` per row (EOS disabled, like ``stop=[]``)."""
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=self.pad,
                streamer=streamer,
            )
        return out[:, width:].numpy()

    def batch1(self, prompt: list[int], max_new_tokens: int) -> Run:
        stamps = _Stamps()
        start = time.perf_counter()
        tokens = self.generate([prompt], max_new_tokens, stamps)
        return Run(prompt, tokens[0].tolist(), start, stamps.stamps)

    def batch(self, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, np.ndarray]:
        started = time.perf_counter()
        tokens = self.generate(prompts, max_new_tokens)
        return time.perf_counter() - started, tokens


# -- the run --------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def report(table: str, result: dict[str, Any], path: str | None) -> None:
    """Print ``table``; with ``path``, also write ``result`` there as JSON."""
    print(table)
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
        log(f"wrote {path}")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), cpu)
    except OSError:
        pass
    versions = {"python": platform.python_version(), "numpy": np.__version__, "pie": pie_version}
    try:
        import torch
        import transformers

        versions |= {"torch": torch.__version__, "transformers": transformers.__version__}
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "versions": versions, "loadavg_start": os.getloadavg()[0]}


def median_run(runs: list[Run]) -> dict[str, float]:
    return {
        "decode_tps": statistics.median(r.decode_tps for r in runs),
        "e2e_tps": statistics.median(r.e2e_tps for r in runs),
        "decode_ms_per_step": 1000 / statistics.median(r.decode_tps for r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke check: 8 new tokens, 8 concurrent, one repeat")
    ap.add_argument("--skip-transformers", action="store_true", help="engine columns only")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--tokens", type=int, help="new tokens per request (default 32; 8 with --quick)")
    ap.add_argument("--concurrency", type=int, help="concurrent requests (default 32; 8 with --quick)")
    ap.add_argument("--repeats", type=int, help="batch-1 repeats, median reported (default 3; 1 with --quick)")
    args = ap.parse_args(argv)

    n_tok = args.tokens or (8 if args.quick else 32)
    n_conc = args.concurrency or (8 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 3)
    if not 1 <= n_conc <= len(PROMPTS):
        ap.error(f"--concurrency must be between 1 and {len(PROMPTS)}, got {n_conc}")
    if n_tok < 2:
        ap.error(f"--tokens must be >= 2 (decode needs a token after the first), got {n_tok}")
    prompts = PROMPTS[:n_conc]
    result: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/decode.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "config": {"new_tokens": n_tok, "concurrency": n_conc, "batch1_repeats": repeats},
        "goals": {"batch1_decode_ratio": GOAL_BATCH1_DECODE, "batchN_decode_ratio": GOAL_BATCHN_DECODE},
    }

    # Both sides are loaded up front and measured alternately, phase by phase, so that
    # anything else running on the machine weighs on both sides alike.
    log("engine: loading the default model on the cpu backend")
    t = time.perf_counter()
    engine = Engine("cpu")
    loaded = engine.load(None)
    log(f"engine: {loaded.name} loaded in {time.perf_counter() - t:.1f}s")
    hf = None
    if args.skip_transformers:
        result["transformers_skipped"] = "--skip-transformers"
    else:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as exc:
            result["transformers_skipped"] = f"transformers not importable ({exc})"
        else:
            log("transformers: loading the GGUF (dequantised to fp32)")
            t = time.perf_counter()
            hf = HFSide()
            log(f"transformers: loaded in {time.perf_counter() - t:.1f}s")

    log("warm-up")
    _, warm = engine_concurrent(engine, prompts, 2)
    prompt_ids = [r["prompt"] for r in warm]
    engine_batch1(engine, prompts[0], 4)
    if hf is not None:
        hf.batch(prompt_ids, 2)
        hf.batch1(prompt_ids[0], 4)

    log(f"batch 1, {n_tok} tokens, x{repeats} per side")
    e_runs: list[Run] = []
    h_runs: list[Run] = []
    for _ in range(repeats):
        e_runs.append(engine_batch1(engine, prompts[0], n_tok))
        if hf is not None:
            h_runs.append(hf.batch1(prompt_ids[0], n_tok))

    log(f"batch {n_conc}, prefill only")
    e_prefill, _ = engine_concurrent(engine, prompts, 1)
    h_prefill = hf.batch(prompt_ids, 1)[0] if hf is not None else 0.0

    log(f"batch {n_conc}, {n_tok} tokens each")
    before = batcher_snapshot(engine)
    e_total, e_results = engine_concurrent(engine, prompts, n_tok)
    stats = batcher_delta(engine, before)
    if hf is not None:
        h_total, h_tokens = hf.batch(prompt_ids, n_tok)
    assert engine.pools_whole(), "the benchmark leaked KV pages"
    asyncio.run(engine.close())

    e_new = sum(len(r["tokens"]) for r in e_results)
    result["engine"] = {
        "batch1": median_run(e_runs),
        "batchN": {
            "wall_s": e_total,
            "prefill_s": e_prefill,
            "total_tps": e_new / e_total,
            "decode_tps": n_conc * (n_tok - 1) / (e_total - e_prefill),
            "decode_ms_per_step": 1000 * (e_total - e_prefill) / (n_tok - 1),
        },
        "batcher": stats,
        "prompt_tokens": {"batch1": len(e_runs[0].prompt), "batchN_mean": float(np.mean([len(p) for p in prompt_ids]))},
    }
    if hf is not None:
        result["transformers"] = {
            "batch1": median_run(h_runs),
            "batchN": {
                "wall_s": h_total,
                "prefill_s": h_prefill,
                "total_tps": h_tokens.size / h_total,
                "decode_tps": n_conc * (n_tok - 1) / (h_total - h_prefill),
                "decode_ms_per_step": 1000 * (h_total - h_prefill) / (n_tok - 1),
            },
        }
        # Same weights, same greedy decoding: the outputs should mostly agree (fp32 sums in a
        # different order can flip a near-tie, after which the continuations differ).
        same1 = _common_prefix(e_runs[0].tokens, h_runs[0].tokens)
        sameN = [_common_prefix(r["tokens"], h.tolist()) for r, h in zip(e_results, h_tokens)]
        result["agreement"] = {
            "batch1_common_prefix": same1,
            "batchN_identical": sum(s == n_tok for s in sameN),
            "batchN_mean_common_prefix": float(np.mean(sameN)),
        }

    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    report(render(result), result, args.json)
    return 0


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def render(r: dict[str, Any]) -> str:
    """The results as a Markdown table plus the goal verdicts."""
    cfg, e = r["config"], r["engine"]
    h = r.get("transformers")
    n = cfg["concurrency"]
    rows = [
        ("batch 1, decode tok/s", e["batch1"]["decode_tps"], h and h["batch1"]["decode_tps"], GOAL_BATCH1_DECODE),
        ("batch 1, end-to-end tok/s", e["batch1"]["e2e_tps"], h and h["batch1"]["e2e_tps"], None),
        (f"batch {n}, total tok/s (prefill incl.)", e["batchN"]["total_tps"], h and h["batchN"]["total_tps"], None),
        (f"batch {n}, decode-only tok/s", e["batchN"]["decode_tps"], h and h["batchN"]["decode_tps"], GOAL_BATCHN_DECODE),
        ("batch 1, decode ms/step", e["batch1"]["decode_ms_per_step"], h and h["batch1"]["decode_ms_per_step"], None),
        (f"batch {n}, decode ms/step", e["batchN"]["decode_ms_per_step"], h and h["batchN"]["decode_ms_per_step"], None),
        (f"batch {n}, prefill-only wall s", e["batchN"]["prefill_s"], h and h["batchN"]["prefill_s"], None),
    ]
    m = r["machine"]
    out = [
        f"machine: {m['cpu']}, {m['cores']} cores; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"1-min load average: {m['loadavg_start']:.2f} before loading, {m['loadavg_end']:.2f} at the end "
        "(the end includes this run's own threads; well above 0 before loading means other processes "
        "compete for the cores: rerun on a quiet machine)",
        f"new tokens per request: {cfg['new_tokens']}; concurrency: {n}; batch-1 median of {cfg['batch1_repeats']}",
        "",
        "| measure | pie cpu backend | transformers fp32 | ratio (pie / hf) | goal |",
        "|---|---:|---:|---:|---|",
    ]
    verdicts = []
    for label, ev, hv, goal in rows:
        lower_is_better = "ms/step" in label or "wall s" in label
        ratio = (hv / ev if lower_is_better else ev / hv) if hv else None
        goal_txt = f"≥ {goal:.1f}×" if goal else ""
        out.append(
            f"| {label} | {ev:.2f} | {hv:.2f} | {ratio:.2f}× | {goal_txt} |" if hv else f"| {label} | {ev:.2f} | — | — | {goal_txt} |"
        )
        if goal and ratio is not None:
            verdicts.append(f"{label}: {ratio:.2f}× vs goal ≥ {goal:.1f}× — {'MET' if ratio >= goal else 'MISSED'}")
    out.append("")
    out.append("(ms/step and wall-s rows: ratio is hf / pie, so > 1 still means pie is faster)")
    b = e["batcher"]
    out.append(
        f"engine batcher during the batch-{n} run: {b['batches']} batches, {b['requests']} requests, "
        f"mean {b['mean_requests_per_batch']:.1f} requests/batch (max {b['max_requests_per_batch']}), "
        f"backend busy {b['backend_seconds']:.1f}s; sizes {b['sizes']}"
    )
    out.append(f"prompt tokens: batch 1 {e['prompt_tokens']['batch1']}, batch {n} mean {e['prompt_tokens']['batchN_mean']:.1f}")
    if "agreement" in r:
        a = r["agreement"]
        out.append(
            f"greedy agreement with transformers: batch 1 common prefix {a['batch1_common_prefix']}/{cfg['new_tokens']} tokens; "
            f"batch {n}: {a['batchN_identical']}/{n} identical, mean common prefix {a['batchN_mean_common_prefix']:.1f}"
        )
    if "transformers_skipped" in r:
        out.append(f"transformers columns skipped: {r['transformers_skipped']}")
    out += ["", *verdicts]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
