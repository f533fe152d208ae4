"""Decode on the CPU: the tensorrt backend's ONNX graph on ONNX Runtime's CPU provider (float32,
and 4-bit ``MatMulNBits``) against the torch backend and the cpu (NumPy) backend.

Every side serves the default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF) in one process,
is loaded first, and is measured alternately phase by phase, so other load on the machine weighs
on all alike. Greedy tokens of each side are compared with the first side's.

    python benchmarks/onnx_decode.py                 # 32 new tokens, batch 1 and 32 concurrent
    python benchmarks/onnx_decode.py --quick         # 8 new tokens, 8 concurrent
    python benchmarks/onnx_decode.py --skip-cpu --json out.json

Sides: ``ort-fp32`` (``--backend tensorrt --backend-option provider=cpu``), ``ort-int4``
(``... quant=int4``: ONNX Runtime's quantizer, block 32, int8 activations), ``torch`` (its
CPU default: ``dtype=auto``), ``cpu`` (NumPy float32). Measured: batch-1 decode tok/s (first to
last new token, median of ``--repeats``) and batch-N total tok/s (all new tokens over the wall
time, prefill included).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from decode import PROMPTS, Run, engine_batch1, engine_concurrent, log, machine, median_run, report  # noqa: E402
from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions


class Side:
    """One engine serving the default model."""

    def __init__(self, name: str, backend: str, options: BackendOptions) -> None:
        self.name, self.backend = name, backend
        started = time.perf_counter()
        self.engine = Engine(backend, options=options)
        self.engine.load(None)
        self.load_s = time.perf_counter() - started
        caps = next(iter(self.engine.models.values())).caps
        self.detail = f"{backend}, {caps.dtype}" + (f", {options.extra}" if options.extra else "")

    def close(self) -> None:
        import asyncio

        assert self.engine.pools_whole(), f"{self.name} leaked KV pages"
        asyncio.run(self.engine.close())


def _sides(args: argparse.Namespace) -> list[Side]:
    threads = {"threads": args.threads}
    wanted = [
        ("ort-fp32", "tensorrt", BackendOptions(dtype="float32", extra={"provider": "cpu", **threads})),
        ("ort-int4", "tensorrt", BackendOptions(dtype="float32", extra={"provider": "cpu", "quant": "int4", **threads})),
        ("torch", "torch", BackendOptions(dtype="auto", extra=threads)),
        ("cpu", "cpu", BackendOptions()),
    ]
    sides = []
    for name, backend, options in wanted:
        if name == "cpu" and args.skip_cpu or name == "torch" and args.skip_torch:
            continue
        log(f"loading {name}")
        sides.append(Side(name, backend, options))
        log(f"{name} loaded in {sides[-1].load_s:.1f} s")
    return sides


def _agreement(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 new tokens, 8 concurrent, one repeat")
    ap.add_argument("--skip-cpu", action="store_true", help="leave out the cpu (NumPy) backend")
    ap.add_argument("--skip-torch", action="store_true", help="leave out the torch backend")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime and torch threads (default 2)")
    ap.add_argument("--tokens", type=int, help="new tokens per request (default 32; 8 with --quick)")
    ap.add_argument("--concurrency", type=int, help="concurrent requests (default 32; 8 with --quick)")
    ap.add_argument("--repeats", type=int, help="batch-1 repeats, median reported (default 3; 1 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    n = args.tokens or (8 if args.quick else 32)
    conc = args.concurrency or (8 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 3)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(conc)]
    sides = _sides(args)
    for s in sides:  # warm every side (first passes allocate, first-shape work)
        engine_concurrent(s.engine, prompts[:2], 2)
    runs: dict[str, list[Run]] = {s.name: [] for s in sides}
    for _ in range(repeats):
        for s in sides:
            runs[s.name].append(engine_batch1(s.engine, PROMPTS[0], n))
    batch: dict[str, tuple[float, list[list[int]]]] = {}
    for s in sides:
        log(f"{s.name}: {conc} concurrent")
        wall, results = engine_concurrent(s.engine, prompts, n)
        batch[s.name] = (wall, [r["tokens"] for r in results])
    first = sides[0].name
    result: dict[str, Any] = {"machine": machine(), "tokens": n, "concurrency": conc, "repeats": repeats, "sides": {}}
    for s in sides:
        wall, toks = batch[s.name]
        result["sides"][s.name] = {
            "detail": s.detail,
            "load_s": round(s.load_s, 1),
            "batch1": median_run(runs[s.name]),
            "batchN_total_tps": sum(len(t) for t in toks) / wall,
            "batch1_tokens_equal_first_side": _agreement(runs[s.name][0].tokens, runs[first][0].tokens),
        }
        s.close()
    report(render(result), result, args.json)
    return 0


def render(r: dict[str, Any]) -> str:
    base = r["sides"].get("torch") or next(iter(r["sides"].values()))
    lines = [f"CPU: {r['machine']['cpu']} ({r['machine']['cores']} cores); {r['tokens']} new tokens; "
             f"batch {r['concurrency']} concurrent; versions {r['machine']['versions']}",
             "| side | detail | batch 1 decode tok/s | vs torch | batch N total tok/s | vs torch | greedy = first side |",
             "|---|---|---|---|---|---|---|"]
    for name, s in r["sides"].items():
        b1, bn = s["batch1"]["decode_tps"], s["batchN_total_tps"]
        lines.append(f"| {name} | {s['detail']} | {b1:.1f} | {b1 / base['batch1']['decode_tps']:.2f}x | {bn:.1f} | "
                     f"{bn / base['batchN_total_tps']:.2f}x | {s['batch1_tokens_equal_first_side']}/{r['tokens']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
