"""A TypeScript inferlet uploaded to ``pie serve`` runs in the wasm sandbox even where the
server's runner is in-process (``JsInWasm``), and returns what its Python twin returns there."""

from __future__ import annotations

from pathlib import Path

import pytest

from pie_core.client import connect
from pie_core.runtime.launcher import InProcessLauncher
from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.wasm.host import GuestLimits
from pie_core.runtime.wasm.launcher import JsInWasm, wasm_missing

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.js_build


def test_an_uploaded_ts_inferlet_returns_what_its_python_twin_returns(served):
    missing = wasm_missing(load_manifest(EXAMPLES / "text-completion-ts"))
    if missing:
        pytest.skip(missing)
    launcher = JsInWasm(InProcessLauncher(), GuestLimits(wall_s=60.0, memory_mb=512))

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            results = {}
            for name in ("text-completion", "text-completion-ts"):
                program = await client.install(EXAMPLES / name)
                proc = await client.launch(program, {"prompt": "Hi.", "max_tokens": 12})
                events = [ev async for ev in proc.events()]
                results[name] = ([e.value for e in events if e.kind == "stdout"], events[-1].kind, events[-1].value)
            return results

    results = served(scenario, launcher=launcher)
    assert results["text-completion-ts"] == results["text-completion"]
    assert results["text-completion"][1:] == ("return", {"tokens": 12})
