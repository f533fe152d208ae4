"""Speculative decoding benchmark: no speculation vs the system n-gram drafter vs a plain
prompt-lookup speculator, on the torch and cpu (NumPy) backends.

Each backend serves the default model (Qwen2.5-Coder-0.5B-Instruct). For every (backend,
workload, batch) one inferlet prefills its prompts once, then decodes greedily from forks of
them in every mode, ``--repeats`` times with the mode order rotated, so that other load on the
machine weighs on the modes alike (medians are reported):

    python benchmarks/speculation.py                       # full run, both backends
    python benchmarks/speculation.py --quick               # smoke check: 16 tokens, batch 4
    python benchmarks/speculation.py --backends torch --json out.json

Workloads: ``copy`` (rewrite a ~30-line Python function under a new name: the answer copies
most of the prompt) and ``free`` (a short essay: nothing to copy; essays, because this small
model's greedy stories soon loop, which a drafter then predicts: ``self-repeat`` reports the share
of repeated 3-grams in the output without speculation). Modes: ``none``, ``system``
(``system_speculation=True``: :mod:`pie_core.speculation.ngram`) and ``custom``
(:class:`PromptLookup` below, ``speculator=``). Batch 1 is one context; batch N is N contexts
decoding together (same workload, prompts differ by names or topics): 16 on torch, 8 on the
cpu backend (``--cpu-batch``), whose batch-16 run would not fit ~15 minutes on 2 cores.

Measured per (backend, workload, batch, mode): decode tok/s (all new tokens over the time from
the start of the first step to the end of the last, summed over contexts; prefill is done
before), tokens per step (mean ``len(out.tokens)``), ms per engine step (what verifying drafts
costs), acceptance (drafts kept / proposed: the system drafter's counters, which leave its last
proposal unscored, or the speculator's own), the ratio to ``none`` from the same run, and whether the greedy tokens equal ``none``'s (a
mismatch is printed loudly, not raised). ``stop=[]``: every context generates exactly its token
budget. Goals: system / none ≥ 1.8× on copy at batch 1, ≥ 0.95× on free text at batch 1 and N.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from decode import batcher_delta, batcher_snapshot, log, machine, report  # noqa: E402
from inferlet import Context, Model, Sampler, runtime
from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.runtime.instance import run_main

GOAL_COPY_BATCH1 = 1.8  # system / none decode tok/s, copy workload, batch 1
GOAL_FREE = 0.95  # system / none decode tok/s, free text, batch 1 and N (at most 5% slower)
MODES = ("none", "system", "custom")
WORKLOADS = ("copy", "free")

FUNCTION = '''def NAME(items, key=None, reverse=False):
    """Sort a list with a stable top-down merge sort.

    Args:
        items: The values to sort; left unchanged.
        key: A function of one value giving what to compare (the value itself if None).
        reverse: Largest first when True.

    Returns:
        A new sorted list.
    """
    if len(items) <= 1:
        return list(items)
    middle = len(items) // 2
    left = NAME(items[:middle], key=key, reverse=reverse)
    right = NAME(items[middle:], key=key, reverse=reverse)
    pick = key if key is not None else (lambda value: value)
    merged = []
    i = j = 0
    while i < len(left) and j < len(right):
        a, b = pick(left[i]), pick(right[j])
        take_right = a < b if reverse else b < a
        if take_right:
            merged.append(right[j])
            j += 1
        else:
            merged.append(left[i])
            i += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged
'''
NAMES = [("merge_sort", "stable_sort"), ("sort_items", "ordered"), ("msort", "sorted_copy"), ("mergesort", "sort_list"),
         ("do_sort", "sort_values"), ("sort_rows", "sort_records"), ("tsort", "merge_ordered"), ("sort_all", "arrange"),
         ("sort_keys", "sort_by_key"), ("order", "put_in_order"), ("ms", "merge_sort_list"), ("sort2", "sort_stable"),
         ("sorter", "sort_entries"), ("rank", "rank_items"), ("sort_by", "sort_using"), ("merge_it", "merge_sorted")]
TOPICS = ["the history of the printing press", "how bees make honey", "the benefits of learning a second language",
          "why sleep matters", "how tides work", "the invention of the telephone", "what makes a good teacher",
          "the water cycle", "the importance of public libraries", "how volcanoes form", "the role of museums",
          "the future of electric cars", "how bread is made", "the value of walking", "how glass is made",
          "the history of the bicycle"]


def prompts(workload: str, n: int) -> list[str]:
    if workload == "copy":
        return [f"Rewrite this Python function with the function renamed from `{old}` to `{new}` (its recursive "
                f"calls too). Output only the code.\n\n```python\n{FUNCTION.replace('NAME', old)}```"
                for old, new in NAMES[:n]]
    return [f"Write a short essay on {t}." for t in TOPICS[:n]]


class PromptLookup:
    """A plain prompt-lookup speculator (:class:`inferlet.spec.Speculator`): every step, the
    ``length`` tokens that followed the latest earlier occurrence of the last 3 (else 2) tokens.
    No adaptation: it drafts whenever something matches."""

    def __init__(self, history: list[int], length: int = 6) -> None:
        self.history = list(history)  # prompt and accepted tokens: the context's whole text
        self.length = length
        self.proposed = 0
        self.kept = 0

    def draft(self) -> tuple[list[int], list[int]]:
        h = np.asarray(self.history)
        for n in (3, 2):
            if len(h) <= n:
                continue
            hits = np.flatnonzero((sliding_window_view(h[:-1], n) == h[-n:]).all(axis=1))
            if hits.size:
                drafts = h[hits[-1] + n : hits[-1] + n + self.length].tolist()
                self.proposed += len(drafts)
                self.kept += len(drafts)  # until rollback says otherwise
                return drafts, list(range(len(h), len(h) + len(drafts)))
        return [], []

    def accept(self, tokens: list[int]) -> None:
        self.history.extend(tokens)

    def rollback(self, n: int) -> None:
        self.kept -= n


async def _decode(base: Context, prompt: list[int], mode: str, n_tok: int) -> dict[str, Any]:
    """Greedy decode from a fork of ``base`` (prefilled with ``prompt``) in ``mode``."""
    with base.fork() as ctx:
        ctx.cue()
        spec = PromptLookup(prompt + ctx.buffer()) if mode == "custom" else None
        g = ctx.generate(Sampler.argmax(), max_tokens=n_tok, stop=[], auto_flush=False,
                         speculator=spec, system_speculation=mode == "system")
        tokens: list[int] = []
        steps = 0
        start = time.perf_counter()
        async for step in g:
            tokens += (await step.execute()).tokens
            steps += 1
        end = time.perf_counter()
        counter = spec if spec is not None else ctx._ctx.drafter  # the host context's drafter
        proposed, kept = (counter.proposed, counter.kept) if counter is not None else (0, 0)
    return {"tokens": tokens, "steps": steps, "start": start, "end": end, "proposed": proposed, "kept": kept}


def _bench_main(texts: list[str], n_tok: int, repeats: int):
    """An inferlet: prefill ``texts`` once, then decode forks in every mode, order rotated."""

    async def main(_: dict[str, Any]) -> dict[str, Any]:
        model = Model.load(runtime.models()[0])
        bases = [Context(model).user(t) for t in texts]
        ids = [b.buffer() for b in bases]
        await asyncio.gather(*(b.flush() for b in bases))
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for r in range(repeats):
            for mode in MODES[r % 3 :] + MODES[: r % 3]:
                out = await asyncio.gather(*(_decode(b, p, mode, n_tok) for b, p in zip(bases, ids)))
                runs[mode].append({
                    "seconds": max(o["end"] for o in out) - min(o["start"] for o in out),
                    "tokens": [o["tokens"] for o in out],
                    "steps": sum(o["steps"] for o in out),
                    "proposed": sum(o["proposed"] for o in out),
                    "kept": sum(o["kept"] for o in out),
                })
        for b in bases:
            b.release()
        return {"prompt_tokens": [len(p) for p in ids], "runs": runs}

    return main


def run_in_process(engine: Engine, main: Any) -> dict[str, Any]:
    events: list[Event] = []
    final = asyncio.run(run_main(engine, main, {}, events.append))
    if final.kind != "return":
        raise RuntimeError(f"inferlet failed: {final.value}")
    return final.value


def summarise(out: dict[str, Any]) -> dict[str, Any]:
    """Medians per mode, ratios to ``none``, and greedy-token agreement with ``none``'s first run."""
    runs, modes = out["runs"], {}
    ref = runs["none"][0]["tokens"]
    for mode, reps in runs.items():
        tps = [sum(map(len, r["tokens"])) / r["seconds"] for r in reps]
        batch = len(reps[0]["tokens"])
        differ = [_first_difference(a, b) for r in reps for a, b in zip(ref, r["tokens"])]
        proposed = sum(r["proposed"] for r in reps)
        modes[mode] = {
            "decode_tps": statistics.median(tps),
            "decode_tps_runs": tps,
            "tokens_per_step": sum(sum(map(len, r["tokens"])) for r in reps) / sum(r["steps"] for r in reps),
            "ms_per_step": statistics.median(1000 * r["seconds"] * batch / r["steps"] for r in reps),
            "acceptance": sum(r["kept"] for r in reps) / proposed if proposed else None,
            "drafts_proposed": proposed,
            "mismatches": [d for d in differ if d is not None],  # first differing index per sequence
        }
    for m in modes.values():
        m["ratio"] = m["decode_tps"] / modes["none"]["decode_tps"]
    repeats = [1 - len(set(zip(t, t[1:], t[2:]))) / max(1, len(t) - 2) for t in ref]
    return {"prompt_tokens": out["prompt_tokens"], "self_repeat": float(np.mean(repeats)), "modes": modes,
            "tokens": {m: r[0]["tokens"] for m, r in runs.items()}}


def _first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def bench_backend(backend: str, sizes: list[tuple[int, int]], repeats: int) -> list[dict[str, Any]]:
    log(f"{backend}: loading")
    engine = Engine(backend)
    engine.load(None)
    log(f"{backend}: warm-up")
    for workload in WORKLOADS:
        run_in_process(engine, _bench_main(prompts(workload, 2), 4, 1))
    rows = []
    for batch, n_tok in sizes:
        for workload in WORKLOADS:
            log(f"{backend}: {workload}, batch {batch}, {n_tok} tokens, x{repeats}")
            row: dict[str, Any] = {"backend": backend, "workload": workload, "batch": batch, "new_tokens": n_tok}
            before = batcher_snapshot(engine)
            try:
                row |= summarise(run_in_process(engine, _bench_main(prompts(workload, batch), n_tok, repeats)))
            except RuntimeError as exc:  # reported in the table; the other rows still run
                log(f"{backend}: {workload}, batch {batch} FAILED: {exc}")
                row["error"] = str(exc)
            row["mean_requests_per_batch"] = batcher_delta(engine, before)["mean_requests_per_batch"]
            rows.append(row)
    assert engine.pools_whole(), f"{backend}: the benchmark leaked KV pages"
    asyncio.run(engine.close())
    return rows


def machine_info() -> dict[str, Any]:
    info = machine()
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    info["avx512_bf16"] = "avx512_bf16" in lscpu
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    info["git_commit"] = git.stdout.strip() or None
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke check: 16 tokens, batch 4, one repeat")
    ap.add_argument("--backends", default="torch,cpu", help="comma-separated: torch, cpu (default both)")
    ap.add_argument("--repeats", type=int, help="measurements per mode, median reported (default 3; 1 with --quick)")
    ap.add_argument("--batch", type=int, help="concurrent contexts of the batch-N rows (default 16; 4 with --quick)")
    ap.add_argument("--cpu-batch", type=int, help="batch N on the cpu backend (default 8: it is slow at 16)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or not set(backends) <= {"torch", "cpu"}:
        ap.error(f"--backends takes torch and/or cpu, got {args.backends!r}")
    repeats = args.repeats or (1 if args.quick else 3)
    batch = args.batch or (4 if args.quick else 16)
    if not 2 <= batch <= len(NAMES):
        ap.error(f"--batch must be in [2, {len(NAMES)}], got {batch}")
    sizes = {
        "torch": [(1, 16 if args.quick else 128), (batch, 16 if args.quick else 64)],
        "cpu": [(1, 16 if args.quick else 96), (args.cpu_batch or (batch if args.quick else 8), 16 if args.quick else 48)],
    }
    result: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/speculation.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine_info(),
        "config": {"repeats": repeats, "sizes": {b: sizes[b] for b in backends}},
        "rows": [],
    }
    for backend in backends:
        result["rows"] += bench_backend(backend, sizes[backend], repeats)
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    report(render(result), result, args.json)
    return 0


def render(r: dict[str, Any]) -> str:
    """A Markdown table (one line per backend, workload, batch and mode), then the goal verdicts."""
    m = r["machine"]
    out = [
        f"machine: {m['cpu']}, {m['cores']} cores, avx512_bf16 {'yes' if m['avx512_bf16'] else 'no'}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + f"; commit {m['git_commit']}",
        f"1-min load average: {m['loadavg_start']:.2f} at the start, {m['loadavg_end']:.2f} at the end "
        "(other processes on the cores make every number noisy; the ratios less so)",
        f"median of {r['config']['repeats']} per mode, modes alternated; sizes (batch, new tokens): {r['config']['sizes']}",
        "",
        "| backend | workload | batch | mode | decode tok/s | tok/step | ms/step | acceptance | × none | tokens = none "
        "| self-repeat |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    verdicts, mismatches = [], []
    for row in r["rows"]:
        if "error" in row:
            mismatches.append(f"{row['backend']} {row['workload']} batch {row['batch']} FAILED: {row['error']}")
            continue
        for mode, s in row["modes"].items():
            acc = "—" if s["acceptance"] is None else f"{100 * s['acceptance']:.0f}%"
            same = "yes" if not s["mismatches"] else f"NO ({len(s['mismatches'])} differ)"
            out.append(f"| {row['backend']} | {row['workload']} | {row['batch']} | {mode} | {s['decode_tps']:.1f} | "
                       f"{s['tokens_per_step']:.2f} | {s['ms_per_step']:.0f} | {acc} | {s['ratio']:.2f}× | {same} | "
                       + (f"{100 * row['self_repeat']:.0f}% |" if mode == "none" else " |"))
            if s["mismatches"]:
                mismatches.append(f"GREEDY TOKEN MISMATCH: {row['backend']} {row['workload']} batch {row['batch']} {mode}: "
                                  f"{len(s['mismatches'])} sequences differ from none's, first at token(s) {s['mismatches'][:8]}")
        goal = GOAL_COPY_BATCH1 if row["workload"] == "copy" else GOAL_FREE
        if row["workload"] == "free" or row["batch"] == 1:
            ratio = row["modes"]["system"]["ratio"]
            verdicts.append(f"{'PASS' if ratio >= goal else 'MISS'}  {row['backend']} {row['workload']} batch "
                            f"{row['batch']}: system / none {ratio:.2f}× (goal ≥ {goal}×)")
    out += ["", *verdicts, ""]
    out += [f"!!! {x}" for x in mismatches] or ["greedy tokens: identical across modes and repeats"]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
