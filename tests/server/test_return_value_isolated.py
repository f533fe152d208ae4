"""Every runner treats ``main``'s return value alike: a JSON value is the Return event, anything
else one error event naming its type, with the same text in-process, in a worker process and in
the wasm sandbox; and every page the inferlet held is back in the pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from wasm_helpers import run_wasm

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.process import ProcessLauncher, WorkerLimits
from pie_core.runtime.wasm.build import toolchain_missing

RETURNS = '''
from inferlet import Context, Model, runtime

VALUES = {
    "ok": {"a": [1, 2.5, None, True, "s"]},
    "set": {1, 2},
    "bytes": {"blob": b"\\x00"},
    "nan": [float("nan")],
    "key": {(1, 2): "pair"},
}

async def main(input):
    ctx = Context(Model.load(runtime.models()[0]))  # left open: the runner frees it
    ctx.user("hold a page")
    await ctx.flush()
    return VALUES[input["kind"]]
'''

EXPECTED = {
    "ok": ("return", {"a": [1, 2.5, None, True, "s"]}),
    "set": ("error", "TypeError: main returned a value of type set, which is not JSON-serialisable: "
                     "return JSON-compatible values (dict, list, str, int, float, bool or None)"),
    "bytes": ("error", "TypeError: main returned a value of type dict holding a value of type bytes, which is not "
                       "JSON-serialisable: return JSON-compatible values (dict, list, str, int, float, bool or None)"),
    "nan": ("error", "TypeError: main returned a value of type list that is or holds NaN or infinity, which JSON "
                     "cannot represent: return JSON-compatible values (dict, list, str, int, float, bool or None)"),
    "key": ("error", "TypeError: main returned a value of type dict with a dict key that is not a str, int, float, "
                     "bool or None: return JSON-compatible values (dict, list, str, int, float, bool or None)"),
}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("returns")
    (folder / "Pie.toml").write_text('[package]\nname = "returns"\nversion = "1.0.0"\ndescription = "returns"\n\n'
                                     '[parameters]\nkind = { type = "string", description = "what to return" }\n')
    (folder / "main.py").write_text(RETURNS)
    return folder


def _in_process(engine: Engine, folder: Path, kind: str, scratch: Path) -> Event:
    return asyncio.run(run_inferlet(engine, load_manifest(folder), {"kind": kind}, lambda e: None))


def _process(engine: Engine, folder: Path, kind: str, scratch: Path) -> Event:
    async def main() -> Event:
        launcher = ProcessLauncher(WorkerLimits(wall_s=20.0, cpu_s=20, memory_mb=512))
        inst = HostInstance(engine=engine, emit=lambda e: None, username="alice", scratch_root=scratch)
        try:
            return await launcher.start(engine, load_manifest(folder), {"kind": kind}, inst)
        finally:
            await launcher.aclose()

    return asyncio.run(main())


def _wasm(engine: Engine, folder: Path, kind: str, scratch: Path) -> Event:
    if toolchain_missing():
        pytest.skip(toolchain_missing())
    return run_wasm(engine, load_manifest(folder), {"kind": kind}, scratch_root=scratch)[0]


@pytest.mark.parametrize("runner", [_in_process, _process, _wasm], ids=["in-process", "process", "wasm"])
def test_every_runner_returns_json_and_refuses_the_rest_alike(dummy_engine, program, tmp_path, runner):
    for kind, (expected_kind, expected_value) in EXPECTED.items():
        final = runner(dummy_engine, program, kind, tmp_path)
        assert (final.kind, final.value) == (expected_kind, expected_value), kind
        assert dummy_engine.pools_whole(), kind
