"""An inferlet that runs a list of adapter and file steps in its user's scratch folder, in the
runner a test picks (``isolation``: a worker process or the wasm sandbox)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import Served, write_program

from pie_core.backend_kit.dummy import DummyTiming
from pie_core.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # wasm_helpers: one wasm launcher per session

# Runs ``input["steps"]`` in its user's scratch folder, in order; each save/load/await step adds
# "ok" or "<error class>: <message>" to the result. "busy" starts eight decode steps in the
# background (with a slow backend, operations asked meanwhile wait behind them).
STEPS = r'''
import asyncio, json, os, shutil
from inferlet import Adapter, Context, Model, Sampler, runtime

async def decode(model):
    with Context(model) as ctx:
        ctx.user("busy")
        await ctx.generate(Sampler.argmax(), max_tokens=8, stop=[]).collect_tokens()

async def outcome(awaitable):
    try:
        await awaitable
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

async def main(input):
    model = Model.load(runtime.models()[0])
    here = runtime.scratch_dir()
    at = lambda p: os.path.join(here, p)
    adapters, pending, out, busy = {}, {}, [], []
    for step in json.loads(input["steps"]):
        do = step["do"]
        if do == "busy":
            busy.append(asyncio.ensure_future(decode(model)))
            await asyncio.sleep(0.02)  # its first pass is on the backend
        if do in ("save", "load"):
            name = step.get("adapter", "a")
            if name not in adapters:
                adapters[name] = Adapter.create(model, name)
            try:
                pending[name] = getattr(adapters[name], do)(step["path"])
            except Exception as exc:
                out.append(f"{type(exc).__name__}: {exc}")
                continue
            if step.get("await", True):
                out.append(await outcome(pending.pop(name)))
        elif do == "await":
            name = step.get("adapter", "a")
            out.append(await outcome(pending.pop(name)) if name in pending else "nothing pending")
        elif do == "link":
            os.symlink(step["target"], at(step["at"]))
        elif do == "mkdir":
            os.makedirs(at(step["at"]), exist_ok=True)
        elif do == "write":
            with open(at(step["at"]), "w") as f:
                f.write(step["text"])
        elif do == "rename":
            os.rename(at(step["from"]), at(step["to"]))
        elif do == "remove":
            p = at(step["at"])
            if os.path.islink(p) or os.path.isfile(p):
                os.unlink(p)
            elif os.path.isdir(p):
                shutil.rmtree(p)
    for task in busy:
        await task
    return out
'''

PARAMS = 'steps = { type = "string" }'


@pytest.fixture(params=["process", "wasm"])
def isolation(request: pytest.FixtureRequest) -> Any:
    """The launcher of ``hostile(..., launcher=isolation)``: both runners that sandbox a user."""
    if request.param == "wasm":
        from wasm_helpers import shared_launcher

        return shared_launcher()
    return "process"


@pytest.fixture
def slow_backend(security_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dummy backend takes 50 ms a pass for the test, so a "busy" step keeps it busy."""
    model = next(iter(security_engine.models.values()))
    backend = next(p for p in model.worker.plugins() if isinstance(getattr(p, "timing", None), DummyTiming))
    monkeypatch.setattr(backend, "timing", DummyTiming(step_ms=50))


async def run_steps(s: Served, user: str, folder: Path, steps: list[dict[str, Any]]) -> list[str]:
    """Install and run :data:`STEPS` as ``user``; its outcomes."""
    async with await connect(s.url, s.tokens[user]) as client:
        program = await client.install(write_program(folder, STEPS, name="steps", parameters=PARAMS))
        return await (await client.launch(program, {"steps": json.dumps(steps)})).wait()
