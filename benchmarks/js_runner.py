"""JS inferlets in the wasm sandbox against Python ones (in-process and in wasm), on the dummy
backend, in one process.

    python benchmarks/js_runner.py                  # step_ms=10, 16 inferlets x 64 tokens
    python benchmarks/js_runner.py --n 1 16 --tokens 64

1. **Build**: the JS component of the decode program in an empty cache (esbuild +
   componentize-qjs; the toolchain install is not counted), its size, and wasmtime's compile.
2. **Start**: launch-to-return of an inferlet that returns at once, median of ``--starts``.
3. **Host call**: an inferlet times ``--calls`` calls of ``runtime.instanceId()`` inside itself.
4. **Decode**: ``--n`` concurrent inferlets each decode ``--tokens`` tokens (argmax, no stop,
   ``for await`` over the generator's steps); total tok/s per runner and its ratio to
   in-process. The dummy backend sleeps ``--step-ms`` per batch (a GPU-like step).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.host.binding import HostInstance
from pie_core.models.weights_cache import cache_dir
from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.wasm import js_build
from pie_core.runtime.wasm.host import WasmHost
from pie_core.runtime.wasm.launcher import WasmLauncher

PY = {
    "quick": "async def main(input):\n    return 1\n",
    "calls": """import time
from inferlet import runtime

async def main(input):
    t = time.perf_counter()
    for _ in range(input["calls"]):
        runtime.instance_id()
    return (time.perf_counter() - t) / input["calls"]
""",
    "decode": """from inferlet import Context, Model, Sampler, runtime

async def main(input):
    with Context(Model.load(runtime.models()[0])) as ctx:
        ctx.user("Count to a hundred.")
        g = ctx.generate(Sampler.argmax(), max_tokens=input["tokens"], stop=[])
        async for step in g:
            await step.execute()
        return g.tokens_generated
""",
}
JS = {
    "quick": "export async function main() { return 1; }\n",
    "calls": """import { runtime } from 'inferlet';
export async function main(input: { calls: number }) {
  const t = Date.now();
  for (let i = 0; i < input.calls; i++) runtime.instanceId();
  return (Date.now() - t) / 1000 / input.calls;
}
""",
    "decode": """import { Context, Model, Sampler, runtime } from 'inferlet';
export async function main(input: { tokens: number }) {
  using ctx = new Context(Model.load(runtime.models()[0]));
  ctx.user('Count to a hundred.');
  const g = ctx.generate(Sampler.argmax(), { maxTokens: input.tokens, stop: [] });
  for await (const step of g) await step.execute();
  return g.tokensGenerated;
}
""",
}
PARAMS = {"quick": "", "calls": 'calls = { type = "int" }', "decode": 'tokens = { type = "int" }'}


def _program(root: Path, lang: str, name: str) -> Any:
    folder = root / f"{lang}-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pie.toml").write_text(f'[package]\nname = "{lang}-{name}"\nversion = "1.0.0"\n\n[parameters]\n{PARAMS[name]}\n')
    if lang == "js":
        (folder / "package.json").write_text('{"name": "bench", "private": true, "dependencies": {"inferlet": "*"}}')
        (folder / "index.ts").write_text(JS[name])
    else:
        (folder / "main.py").write_text(PY[name])
    return load_manifest(folder)


async def _run(engine: Engine, runner: str, launcher: WasmLauncher, manifest: Any, args: dict[str, Any]) -> Any:
    inst = HostInstance(engine=engine, emit=lambda event: None)
    if runner == "in-process":
        final = await run_inferlet(engine, manifest, args, inst.emit, instance=inst)
    else:
        final = await launcher.start(engine, manifest, args, inst)
    if final.kind != "return":
        raise RuntimeError(f"{runner}: {manifest.name} failed: {final.value}")
    return final.value


def cold_build(folder: Path) -> dict[str, float]:
    js_build._toolchain(cache_dir())  # installed once per machine: not what a build costs
    with tempfile.TemporaryDirectory(prefix="pie-js-cold-") as cache:
        (Path(cache) / "js-toolchain").symlink_to(cache_dir() / "js-toolchain")
        t = time.perf_counter()
        path = js_build.js_component_path(folder, "index.ts", Path(cache))
        built = time.perf_counter() - t
        t = time.perf_counter()
        WasmHost(path, python=False)
        compiled = time.perf_counter() - t
        return {"build_s": built, "compile_s": compiled, "size_mb": path.stat().st_size / 2**20}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine("dummy", options=BackendOptions(dtype="auto", extra={"step_ms": args.step_ms}))
    engine.load(None)
    launcher = WasmLauncher()
    await launcher.host()
    root = Path(tempfile.mkdtemp(prefix="pie-js-bench-"))
    progs = {(lang, name): _program(root, lang, name) for lang in ("py", "js") for name in PY}
    out: dict[str, Any] = {"build": cold_build(progs["js", "decode"].root), "start_ms": {}, "host_call_us": {}, "decode": {}}
    runners = {"python in-process": ("in-process", "py"), "python wasm": ("wasm", "py"), "js wasm": ("wasm", "js")}
    for label, (runner, lang) in runners.items():
        await _run(engine, runner, launcher, progs[lang, "quick"], {})  # warm: builds, compiles
        times = []
        for _ in range(args.starts):
            t = time.perf_counter()
            await _run(engine, runner, launcher, progs[lang, "quick"], {})
            times.append(time.perf_counter() - t)
        out["start_ms"][label] = statistics.median(times) * 1000
        out["host_call_us"][label] = await _run(engine, runner, launcher, progs[lang, "calls"], {"calls": args.calls}) * 1e6
        await _run(engine, runner, launcher, progs[lang, "decode"], {"tokens": 2})
    for n in args.n:
        rows = out["decode"][n] = {}
        for label, (runner, lang) in runners.items():
            best = 0.0
            for _ in range(args.repeat):
                t = time.perf_counter()
                done = await asyncio.gather(*(_run(engine, runner, launcher, progs[lang, "decode"], {"tokens": args.tokens})
                                              for _ in range(n)))
                best = max(best, sum(done) / (time.perf_counter() - t))
            rows[label] = {"tok_s": best}
        for label in runners:
            rows[label]["vs_in_process"] = rows[label]["tok_s"] / rows["python in-process"]["tok_s"]
            rows[label]["ms_per_token_per_inferlet"] = n / rows[label]["tok_s"] * 1000
    assert engine.pools_whole(), "a benchmark inferlet left pages allocated"
    await engine.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--n", type=int, nargs="+", default=[1, 16])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--starts", type=int, default=20)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    print(json.dumps(asyncio.run(measure(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
