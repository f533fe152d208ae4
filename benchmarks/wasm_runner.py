"""The wasm runner against the in-process and process runners, in one run, on the dummy backend.

    python benchmarks/wasm_runner.py                 # all four measurements
    python benchmarks/wasm_runner.py --skip-cold     # without the cold build (~20 s)

1. **Cold build**: stage the SDK, build the component with componentize-py in an empty cache,
   and compile it with wasmtime (what the first ``pie serve`` on a machine pays once).
2. **Start**: launch-to-return of an inferlet that returns at once, median of ``--starts``:
   in-process (a task), process (a worker forked from the warm zygote), wasm (an instance of
   the compiled, cached component).
3. **Host call**: an inferlet times ``--calls`` calls of a trivial host function
   (``runtime.instance_id()``) inside itself; the cost per call under each runner.
4. **Decode**: for each of ``--n`` (default 16 and 64), that many concurrent inferlets each
   decode ``--tokens`` tokens (argmax, no stop); total tok/s per runner and its ratio to
   in-process, the host calls per token (``/metrics``' count: a steady decode step is one
   ``forward_next``, fewer when a late guest takes several passes at once), and where the CPU
   went per decode pass in the middle of the run: the engine's event-loop thread, the process's
   other threads (wasm guests run there; the backend thread only sleeps) and the worker
   processes (read from ``/proc``). The
   dummy backend sleeps ``--step-ms`` per batch (a GPU-like step: its ``step_ms`` backend
   option), so the ratio shows what the runner costs when the model is not the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import threading
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.host.binding import HostInstance
from pie_core.runtime import host_api
from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.process import ProcessLauncher, WorkerLimits
from pie_core.runtime.wasm.build import component_path
from pie_core.runtime.wasm.host import WasmHost
from pie_core.runtime.wasm.launcher import WasmLauncher

QUICK = "async def main(input):\n    return 1\n"
CALLS = """import time
from inferlet import runtime

async def main(input):
    t = time.perf_counter()
    for _ in range(input["calls"]):
        runtime.instance_id()
    return (time.perf_counter() - t) / input["calls"]
"""
DECODE = """from inferlet import Context, Model, Sampler, runtime

async def main(input):
    with Context(Model.load(runtime.models()[0])) as ctx:
        ctx.user("Count to a hundred.")
        g = ctx.generate(Sampler.argmax(), max_tokens=input["tokens"], stop=[])
        async for step in g:
            await step.execute()
        return g.tokens_generated
"""


def _program(root: Path, name: str, main_py: str, parameters: str = "") -> Any:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pie.toml").write_text(f'[package]\nname = "{name}"\nversion = "1.0.0"\ndescription = "bench"\n\n'
                                     f"[parameters]\n{parameters}\n")
    (folder / "main.py").write_text(main_py)
    return load_manifest(folder)


class _Runners:
    def __init__(self, engine: Engine, wasm: WasmLauncher, process: ProcessLauncher) -> None:
        self.engine, self.wasm, self.process = engine, wasm, process

    async def run(self, runner: str, manifest: Any, args: dict[str, Any]) -> Any:
        inst = HostInstance(engine=self.engine, emit=lambda event: None)
        if runner == "in-process":
            final = await run_inferlet(self.engine, manifest, args, inst.emit, instance=inst)
        else:
            final = await (self.wasm if runner == "wasm" else self.process).start(self.engine, manifest, args, inst)
        if final.kind != "return":
            raise RuntimeError(f"{runner}: {manifest.name} failed: {final.value}")
        return final.value


def cold_build() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="pie-wasm-cold-") as cache:
        t = time.perf_counter()
        path = component_path(Path(cache))
        built = time.perf_counter() - t
        size_mb = path.stat().st_size / 2**20
        t = time.perf_counter()
        WasmHost(path)
        compiled = time.perf_counter() - t
        t = time.perf_counter()
        WasmHost(path)  # the compiled form is cached beside the component now
        cached = time.perf_counter() - t
    return {"componentize_s": built, "compile_s": compiled, "load_cached_s": cached, "size_mb": size_mb}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine("dummy", options=BackendOptions(dtype="auto", extra={"step_ms": args.step_ms}))
    engine.load(None)
    wasm = WasmLauncher()
    await wasm.host()
    process = ProcessLauncher(WorkerLimits(wall_s=600, cpu_s=600, memory_mb=4096))
    process.warm_up()
    runners = _Runners(engine, wasm, process)
    root = Path(tempfile.mkdtemp(prefix="pie-wasm-bench-"))
    quick = _program(root, "quick", QUICK)
    calls = _program(root, "calls", CALLS, "calls = { type = \"int\" }")
    decode = _program(root, "decode", DECODE, "tokens = { type = \"int\" }")
    names = ("in-process", "process", "wasm")
    out: dict[str, Any] = {"start_ms": {}, "host_call_us": {}, "decode": {}}
    for name in names:
        await runners.run(name, quick, {})  # warm: the zygote, the first instance
        times = []
        for _ in range(args.starts):
            t = time.perf_counter()
            await runners.run(name, quick, {})
            times.append(time.perf_counter() - t)
        out["start_ms"][name] = statistics.median(times) * 1000
        out["host_call_us"][name] = await runners.run(name, calls, {"calls": args.calls}) * 1e6
    loop_thread = threading.get_native_id()
    stats = next(iter(engine.models.values())).batcher.stats
    for n in args.n:
        rows = out["decode"][n] = {}
        for name in names:
            calls0, t = sum(host_api.CALLS.values()), time.perf_counter()
            steady = asyncio.ensure_future(_steady_cpu(stats, n * args.tokens, loop_thread))
            done = await asyncio.gather(*(runners.run(name, decode, {"tokens": args.tokens}) for _ in range(n)))
            wall, tokens = time.perf_counter() - t, sum(done)
            cpu = await steady
            rows[name] = {"tok_s": tokens / wall, "calls_per_token": (sum(host_api.CALLS.values()) - calls0) / tokens,
                          **{f"cpu_us_{k}": v for k, v in cpu.items()}}
        for name in names:
            rows[name]["vs_in_process"] = rows[name]["tok_s"] / rows["in-process"]["tok_s"]
    assert engine.pools_whole(), "a benchmark inferlet left pages allocated"
    await process.aclose()
    await engine.close()
    return out


async def _steady_cpu(stats: Any, total: int, loop_thread: int) -> dict[str, float]:
    """CPU microseconds per decode pass, by :func:`_cpu`'s groups, between the passes that make
    a quarter and three quarters of ``total`` (the run's middle: every inferlet started, none
    ended, so the threads and workers measured are all alive); zeros if the run ends first."""
    start = stats.requests
    marks = []
    for share in (0.25, 0.75):
        while stats.requests - start < share * total:
            await asyncio.sleep(0.005)
        marks.append((stats.requests, _cpu(loop_thread)))
    (r0, c0), (r1, c1) = marks
    return {k: (c1[k] - c0[k]) / max(1, r1 - r0) * 1e6 for k in c0}


def _cpu(loop_thread: int) -> dict[str, float]:
    """CPU seconds so far of this process's event-loop thread, of its other threads, and of the
    inferlet workers (every process running the worker; zeros where there is no ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"loop": 0.0, "threads": 0.0, "workers": 0.0}

    def seconds(stat: str) -> float:
        fields = open(stat).read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    for task in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            out["loop" if task.endswith(f"/{loop_thread}") else "threads"] += seconds(task + "/stat")
        except OSError:  # the thread ended meanwhile
            pass
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            if b"pie_core.runtime.process" in open(proc + "/cmdline", "rb").read():
                out["workers"] += seconds(proc + "/stat")
        except OSError:
            pass
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-cold", action="store_true")
    p.add_argument("--starts", type=int, default=20)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--n", type=int, nargs="+", default=[16, 64], help="concurrent inferlets (one run each)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=10.0, help="added time per dummy batch (0: none)")
    args = p.parse_args()
    print(f"python {sys.version.split()[0]} · {os.cpu_count()} cpus")
    if not args.skip_cold:
        cold = cold_build()
        print(f"cold build: componentize {cold['componentize_s']:.1f} s ({cold['size_mb']:.0f} MB), "
              f"compile {cold['compile_s']:.1f} s, load compiled {cold['load_cached_s']:.2f} s")
    out = asyncio.run(measure(args))
    print(f"{'runner':12s} {'start ms':>9s} {'host call us':>13s}")
    for name in ("in-process", "process", "wasm"):
        print(f"{name:12s} {out['start_ms'][name]:9.1f} {out['host_call_us'][name]:13.1f}")
    print(f"\ndecode, {args.tokens} tokens each, step {args.step_ms:g} ms; CPU in us per token")
    print(f"{'inferlets':>9s} {'runner':12s} {'tok/s':>7s} {'ratio':>6s} {'calls/tok':>9s} {'loop':>6s} "
          f"{'threads':>7s} {'workers':>7s}")
    for n, rows in out["decode"].items():
        for name, row in rows.items():
            print(f"{n:9d} {name:12s} {row['tok_s']:7.0f} {row['vs_in_process']:5.2f}x {row['calls_per_token']:9.2f} "
                  f"{row['cpu_us_loop']:6.0f} {row['cpu_us_threads']:7.0f} {row['cpu_us_workers']:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
