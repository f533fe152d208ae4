"""Decode benchmark of the torch backend against the cpu backend, transformers (bf16 and fp32) and llama.cpp.

All sides run the default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF) in one process on the
same prompts; the engine sides build the prompt ids with the chat format inside the inferlet and
the other sides are fed exactly those ids. Every side is loaded first and the sides are measured
alternately, phase by phase, so that other load on the machine weighs on all alike.

    python benchmarks/torch_decode.py                      # 32 new tokens, batch 1 and 32 concurrent
    python benchmarks/torch_decode.py --quick              # 8 new tokens, 8 concurrent
    python benchmarks/torch_decode.py --dtype bfloat16 --quant int4 --skip-cpu --json out.json

Sides (each optional): ``torch`` (the torch backend, ``--dtype``/``--quant``), ``cpu`` (the NumPy
backend), ``transformers bf16`` and ``transformers fp32`` (``from_pretrained(gguf_file=..., dtype=...)``,
left-padded ``generate``; ``--transformers-dtypes``), ``llama.cpp`` on the same GGUF, ``--threads``:
``llama-cpp-python`` when importable (one sequence per context, so only batch 1), else
node-llama-cpp's prebuilt llama.cpp (``benchmarks/llamacpp_node.py``; the batch-N columns decode
the N prompts as N sequences of one context); skipped with a note when neither can run.
transformers and llama.cpp each run in a child process of their own (:class:`ChildSide` says why);
the engines share this one, each on its own backend thread.

Measured: batch-1 decode tok/s (first to last new token, median of ``--repeats``) and end-to-end
tok/s; batch-N total tok/s (all new tokens over the wall time, prefill included) and decode-only
tok/s (minus a prefill-only run). Goals (issue 21): torch batch-1 decode ≥ 1.0× llama.cpp; torch
batch-32 total ≥ 3× the best transformers configuration measured (the faster of bf16 and fp32 on
this CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np

from decode import PROMPTS, Run, engine_batch1, engine_concurrent, log, machine, median_run  # noqa: E402
from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.models.registry import resolve_model

GOAL_BATCH1_VS_LLAMA = 1.0
GOAL_BATCHN_VS_HF_BEST = 3.0


class EngineSide:
    """One engine (one backend) serving the default model."""

    def __init__(self, name: str, backend: str, options: BackendOptions | None = None) -> None:
        self.name = name
        self.engine = Engine(backend, options=options)
        self.engine.load(None)
        caps = next(iter(self.engine.models.values())).caps
        self.detail = f"{backend} backend, {caps.dtype}" + (f", {options.extra}" if options and options.extra else "")

    def batch1(self, prompt: str, prompt_ids: list[int], n: int) -> Run:
        return engine_batch1(self.engine, prompt, n)

    def batch(self, prompts: list[str], prompt_ids: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
        wall, results = engine_concurrent(self.engine, prompts, n)
        return wall, [r["tokens"] for r in results]

    def close(self) -> None:
        assert self.engine.pools_whole(), f"{self.name} leaked KV pages"
        asyncio.run(self.engine.close())


class HFSide:
    """transformers in ``dtype`` on the same GGUF, greedy ``generate`` of exactly n tokens."""

    def __init__(self, dtype: str, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        path = resolve_model(None).path
        short = {"bfloat16": "bf16", "float32": "fp32"}[dtype]
        self.name, self.detail = f"transformers {short}", f"transformers {short}, {threads} threads, own process"
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype))
        self.model.eval()
        self.pad = 151643  # <|endoftext|>, Qwen2's pad token

    def _generate(self, prompts: list[list[int]], n: int, streamer: Any = None) -> np.ndarray:
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=None,
                pad_token_id=self.pad, streamer=streamer,
            )
        return out[:, width:].numpy()

    def batch1(self, prompt: str, prompt_ids: list[int], n: int) -> Run:
        from decode import _Stamps

        stamps = _Stamps()
        start = time.perf_counter()
        tokens = self._generate([prompt_ids], n, stamps)
        return Run(prompt_ids, tokens[0].tolist(), start, stamps.stamps)

    def batch(self, prompts: list[str], prompt_ids: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        tokens = self._generate(prompt_ids, n)
        return time.perf_counter() - start, tokens.tolist()


class LlamaCppSide:
    """llama-cpp-python on the same GGUF (its own Q4_K_M kernels), greedy, one sequence."""

    batch = None  # one sequence per context: no batch-N column

    def __init__(self, threads: int) -> None:
        from llama_cpp import Llama

        self.name, self.detail = "llama.cpp", f"llama-cpp-python, {threads} threads, own process"
        self.llm = Llama(model_path=str(resolve_model(None).path), n_ctx=512, n_threads=threads, n_batch=512, verbose=False)

    def batch1(self, prompt: str, prompt_ids: list[int], n: int) -> Run:
        self.llm.reset()
        start = time.perf_counter()
        tokens: list[int] = []
        stamps: list[float] = []
        for tok in self.llm.generate(prompt_ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            tokens.append(int(tok))
            stamps.append(time.perf_counter())
            if len(tokens) == n:
                break
        return Run(prompt_ids, tokens, start, stamps)


class NodeLlamaCppSide:
    """llama.cpp through node-llama-cpp (``benchmarks/llamacpp_node.py``): a node child process already,
    so no :class:`ChildSide`; stamps are taken in node, from the request's start there."""

    def __init__(self, threads: int) -> None:
        from llamacpp_node import NodeLlamaCpp, NodeLlamaCppUnavailable

        try:
            self.llm = NodeLlamaCpp(resolve_model(None).path, threads)
        except NodeLlamaCppUnavailable as exc:
            raise ImportError(str(exc)) from exc
        self.name, self.detail = "llama.cpp", f"{self.llm.label}, own process"

    def batch1(self, prompt: str, prompt_ids: list[int], n: int) -> Run:
        _, [run] = self.llm.speed([prompt_ids], n)
        return Run(prompt_ids, run.ids, 0.0, run.stamps)

    def batch(self, prompts: list[str], prompt_ids: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
        wall, runs = self.llm.speed(prompt_ids, n)
        return wall, [r.ids for r in runs]

    def close(self) -> None:
        self.llm.close()


_CHILD_SIDES = {"transformers": HFSide, "llama.cpp": LlamaCppSide}


def _side_worker(conn: Any, kind: str, args: tuple[Any, ...]) -> None:
    """Child process of :class:`ChildSide`: build the side, then answer (method, args) calls."""
    try:
        side = _CHILD_SIDES[kind](*args)
    except ImportError as exc:
        conn.send(("missing", exc.name or str(exc)))
        return
    conn.send(("ready", side.name, side.detail, side.batch is not None))
    while (job := conn.recv()) is not None:
        method, call_args = job
        conn.send(getattr(side, method)(*call_args))


class ChildSide:
    """A side (transformers, llama.cpp) in a child process of its own.

    Every torch or llama.cpp side brings an OpenMP team of worker threads. In one process, teams
    of several sides add up to more workers than cores, and libgomp then puts idle workers to
    sleep at once, so every parallel region of every side pays a wake-up (measured: a 0.5 MB q4
    product 13 µs alone, 87 µs with a second team alive; llama.cpp ~17 tok/s in-process against
    ~30 tok/s alone). Each side alone in its process measures what it does alone.
    """

    def __init__(self, kind: str, *args: Any) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_side_worker, args=(child, kind, args), daemon=True)
        self.proc.start()
        reply = self.conn.recv()
        if reply[0] == "missing":
            self.proc.join(timeout=10)
            raise ImportError(reply[1], name=reply[1])
        _, self.name, self.detail, batched = reply
        self.batch = self._batch if batched else None

    def _call(self, method: str, *args: Any) -> Any:
        self.conn.send((method, args))
        return self.conn.recv()

    def batch1(self, prompt: str, prompt_ids: list[int], n: int) -> Run:
        return self._call("batch1", prompt, prompt_ids, n)

    def _batch(self, prompts: list[str], prompt_ids: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
        return self._call("batch", prompts, prompt_ids, n)

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)


def _try(make: Callable[[], Any], why: dict[str, str], name: str) -> Any:
    try:
        side = make()
    except ImportError as exc:
        why[name] = f"not installed ({exc.name or exc})"
        return None
    return side


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 new tokens, 8 concurrent, one repeat")
    ap.add_argument("--device", default="cpu", help="torch backend device: cpu or cuda (default cpu)")
    ap.add_argument("--dtype", default="auto", help="torch backend dtype (default auto: bf16 on a bf16 CPU)")
    ap.add_argument("--quant", default="auto", help="torch backend quantisation for small batches: auto, none, int8, int4, w8a8")
    ap.add_argument("--extra", default="{}", help="more torch backend options as JSON (see pie_backend_torch.options)")
    ap.add_argument("--skip-cpu", action="store_true", help="leave out the cpu (NumPy) backend")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument(
        "--transformers-dtypes", default="bfloat16,float32",
        help="transformers configurations to run (default bfloat16,float32; the batch-N goal is against the fastest)",
    )
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads (default 2)")
    ap.add_argument("--tokens", type=int, help="new tokens per request (default 32; 8 with --quick)")
    ap.add_argument("--concurrency", type=int, help="concurrent requests (default 32; 8 with --quick)")
    ap.add_argument("--repeats", type=int, help="batch-1 repeats, median reported (default 3; 1 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    n_tok = args.tokens or (8 if args.quick else 32)
    n_conc = args.concurrency or (8 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 3)
    if not 1 <= n_conc <= len(PROMPTS) or n_tok < 2:
        ap.error(f"--concurrency must be in [1, {len(PROMPTS)}] and --tokens >= 2")

    import torch

    torch.set_num_threads(args.threads)
    prompts = PROMPTS[:n_conc]
    result: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/torch_decode.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "config": {"new_tokens": n_tok, "concurrency": n_conc, "batch1_repeats": repeats, "threads": args.threads},
        "skipped": {},
    }
    skipped: dict[str, str] = result["skipped"]
    extra = {"quant": args.quant, "threads": args.threads, **json.loads(args.extra)}
    sides: list[Any] = []
    log("loading the torch backend")
    sides.append(EngineSide("torch", "torch", BackendOptions(device=args.device, dtype=args.dtype, extra=extra)))
    if args.skip_cpu:
        skipped["cpu"] = "--skip-cpu"
    else:
        log("loading the cpu backend")
        sides.append(EngineSide("cpu", "cpu"))
    if args.skip_transformers:
        skipped["transformers"] = "--skip-transformers"
    else:
        for hf_dtype in args.transformers_dtypes.split(","):
            log(f"loading transformers {hf_dtype}")
            side = _try(lambda: ChildSide("transformers", hf_dtype, args.threads), skipped, f"transformers {hf_dtype}")
            if side is not None:
                sides.append(side)
    if args.skip_llama_cpp:
        skipped["llama.cpp"] = "--skip-llama-cpp"
    else:
        log("loading llama.cpp")
        side = _try(lambda: ChildSide("llama.cpp", args.threads), skipped, "llama.cpp")
        if side is None:
            why = skipped.pop("llama.cpp")
            side = _try(lambda: NodeLlamaCppSide(args.threads), skipped, "llama.cpp")
            if side is None:
                skipped["llama.cpp"] = f"llama-cpp-python {why}; node-llama-cpp {skipped['llama.cpp']}"
        if side is not None:
            sides.append(side)

    log("warm-up")
    _, warm = engine_concurrent(sides[0].engine, prompts, 2)
    prompt_ids = [r["prompt"] for r in warm]
    for s in sides:
        s.batch1(prompts[0], prompt_ids[0], 4)
        if s.batch is not None:
            s.batch(prompts, prompt_ids, 2)

    runs: dict[str, list[Run]] = {s.name: [] for s in sides}
    log(f"batch 1, {n_tok} tokens, x{repeats}")
    for _ in range(repeats):
        for s in sides:
            runs[s.name].append(s.batch1(prompts[0], prompt_ids[0], n_tok))
    batched = [s for s in sides if s.batch is not None]
    log(f"batch {n_conc}: prefill only, then {n_tok} tokens each")
    prefill = {s.name: s.batch(prompts, prompt_ids, 1)[0] for s in batched}
    totals: dict[str, tuple[float, list[list[int]]]] = {}
    for s in batched:
        totals[s.name] = s.batch(prompts, prompt_ids, n_tok)
    for s in sides:
        s.close()

    result["sides"] = {}
    for s in sides:
        entry: dict[str, Any] = {"detail": s.detail, "batch1": median_run(runs[s.name])}
        if s.name in totals:
            wall, tokens = totals[s.name]
            entry["batchN"] = {
                "wall_s": wall,
                "prefill_s": prefill[s.name],
                "total_tps": sum(len(t) for t in tokens) / wall,
                "decode_tps": n_conc * (n_tok - 1) / (wall - prefill[s.name]),
            }
        result["sides"][s.name] = entry
    first = {name: r[0].tokens for name, r in runs.items()}
    result["agreement_batch1"] = {name: _common_prefix(first["torch"], t) for name, t in first.items() if name != "torch"}
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def render(r: dict[str, Any]) -> str:
    """Markdown table, one column per side, then the goal verdicts."""
    sides, cfg, m = r["sides"], r["config"], r["machine"]
    n = cfg["concurrency"]
    names = list(sides)
    rows = [
        ("batch 1, decode tok/s", lambda e: e["batch1"]["decode_tps"]),
        ("batch 1, end-to-end tok/s", lambda e: e["batch1"]["e2e_tps"]),
        (f"batch {n}, total tok/s (prefill incl.)", lambda e: e["batchN"]["total_tps"]),
        (f"batch {n}, decode-only tok/s", lambda e: e["batchN"]["decode_tps"]),
        (f"batch {n}, prefill-only wall s", lambda e: e["batchN"]["prefill_s"]),
    ]
    out = [
        f"machine: {m['cpu']}, {m['cores']} cores; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"1-min load average: {m['loadavg_start']:.2f} before loading, {m['loadavg_end']:.2f} at the end",
        f"new tokens per request: {cfg['new_tokens']}; concurrency: {n}; threads: {cfg['threads']}; "
        f"batch-1 median of {cfg['batch1_repeats']}",
        "sides: " + "; ".join(f"{k} = {v['detail']}" for k, v in sides.items()),
        "",
        "| measure | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for label, get in rows:
        cells = []
        for name in names:
            try:
                cells.append(f"{get(sides[name]):.2f}")
            except KeyError:
                cells.append("—")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    for name, why in r["skipped"].items():
        out.append(f"\n{name} skipped: {why}")
    out.append(f"\ngreedy batch-1 agreement with torch (common prefix of {cfg['new_tokens']}): {r['agreement_batch1']}")
    t = sides["torch"]
    if "llama.cpp" in sides:
        ratio = t["batch1"]["decode_tps"] / sides["llama.cpp"]["batch1"]["decode_tps"]
        verdict = "MET" if ratio >= GOAL_BATCH1_VS_LLAMA else "MISSED"
        out.append(f"batch 1 decode, torch / llama.cpp: {ratio:.2f}× (goal ≥ {GOAL_BATCH1_VS_LLAMA}×) — {verdict}")
    hf = [name for name in sides if name.startswith("transformers") and "batchN" in sides[name]]
    if hf and "batchN" in t:
        best = max(hf, key=lambda name: sides[name]["batchN"]["total_tps"])
        ratio = t["batchN"]["total_tps"] / sides[best]["batchN"]["total_tps"]
        verdict = "MET" if ratio >= GOAL_BATCHN_VS_HF_BEST else "MISSED"
        out.append(
            f"batch {n} total, torch / best transformers ({best}): {ratio:.2f}× (goal ≥ {GOAL_BATCHN_VS_HF_BEST}×) — {verdict}"
        )
    if "cpu" in sides:
        out.append(
            f"torch / cpu backend: batch 1 decode {t['batch1']['decode_tps'] / sides['cpu']['batch1']['decode_tps']:.2f}×"
            + (f", batch {n} total {t['batchN']['total_tps'] / sides['cpu']['batchN']['total_tps']:.2f}×" if "batchN" in t else "")
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
