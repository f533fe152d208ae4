"""JavaScript and TypeScript inferlets in the wasm sandbox: each TS example returns what its
Python twin returns (dummy backend, argmax, one at a time), and the sandbox holds a JS guest to
the same limits as a Python one. Each component is built once per session (and cached on disk
by content hash, so a second session builds nothing)."""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.errors import InvalidInput
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import Manifest, load_manifest
from pie_core.runtime.wasm.host import GuestLimits
from pie_core.runtime.wasm.js_build import is_js_entry, js_component_path
from pie_core.runtime.wasm.launcher import WasmLauncher, wasm_missing

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PROGRAMS = Path(__file__).resolve().parent / "programs"

pytestmark = pytest.mark.js_build


@pytest.fixture(scope="session")
def engine() -> Engine:
    eng = Engine("dummy")
    eng.load(None)
    return eng


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pie_core.models.weights_cache import cache_dir

    return cache_dir()


@pytest.fixture(scope="session")
def launcher() -> WasmLauncher:
    missing = wasm_missing(load_manifest(EXAMPLES / "text-completion-ts"))
    if missing:
        pytest.skip(missing)
    return WasmLauncher(GuestLimits(wall_s=60.0, memory_mb=512))


def _run(engine: Engine, launcher: Any, manifest: Manifest, args: dict[str, Any]) -> tuple[Event, list[Event]]:
    events: list[Event] = []
    inst = HostInstance(engine=engine, emit=events.append, username="alice")

    async def main() -> Event:
        return await launcher.start(engine, manifest, args, inst)

    final = asyncio.run(main())
    return final, events[:-1]


def _inproc(engine: Engine, manifest: Manifest, args: dict[str, Any]) -> tuple[Event, list[Event]]:
    events: list[Event] = []
    final = asyncio.run(run_inferlet(engine, manifest, args, events.append))
    return final, [e for e in events if e != final]


def _stdout(events: list[Event]) -> str:
    return "".join(e.value for e in events if e.kind == "stdout")


def test_a_ts_example_is_a_js_entry_found_without_naming_it() -> None:
    manifest = load_manifest(EXAMPLES / "text-completion-ts")
    assert manifest.entry == "index.ts" and is_js_entry(manifest.entry)
    assert not is_js_entry(load_manifest(EXAMPLES / "text-completion").entry)


def test_text_completion_ts_returns_and_streams_what_the_python_twin_does(engine: Engine, launcher: WasmLauncher) -> None:
    args = {"prompt": "Hi.", "max_tokens": 24}
    py_final, py_events = _inproc(engine, load_manifest(EXAMPLES / "text-completion"), args)
    js_final, js_events = _run(engine, launcher, load_manifest(EXAMPLES / "text-completion-ts"), args)
    assert js_final == py_final and py_final.kind == "return"
    assert _stdout(js_events) == _stdout(py_events) != ""
    assert engine.pools_whole(), "the JS inferlet left KV pages allocated"


def test_beam_search_ts_returns_what_the_python_twin_does(engine: Engine, launcher: WasmLauncher) -> None:
    args = {"beam_width": 3, "max_tokens": 6}
    py_final, _ = _inproc(engine, load_manifest(EXAMPLES / "beam-search"), args)
    js_final, _ = _run(engine, launcher, load_manifest(EXAMPLES / "beam-search-ts"), args)
    assert py_final.kind == "return" and js_final.kind == "return", js_final
    py, js = py_final.value, js_final.value
    assert [b["text"] for b in js["beams"]] == [b["text"] for b in py["beams"]]
    assert all(math.isclose(a["score"], b["score"], rel_tol=1e-12) for a, b in zip(js["beams"], py["beams"]))
    assert js["text"] == py["text"]
    assert engine.pools_whole(), "forks or beams left KV pages allocated"


def test_a_js_guest_past_its_wall_time_is_killed(engine: Engine, launcher: WasmLauncher) -> None:
    short = WasmLauncher(GuestLimits(wall_s=0.5, memory_mb=512))
    final, _ = _run(engine, short, load_manifest(PROGRAMS / "spin"), {})
    assert final == Event("error", "killed: the inferlet ran past its wall-time limit of 0.5s")


def test_a_js_guest_over_its_memory_limit_is_killed(engine: Engine, launcher: WasmLauncher) -> None:
    small = WasmLauncher(GuestLimits(wall_s=60.0, memory_mb=64))
    final, _ = _run(engine, small, load_manifest(PROGRAMS / "hog"), {})
    assert final.kind == "error"
    assert "memory" in final.value, final.value


def test_a_forged_call_number_is_refused(engine: Engine, launcher: WasmLauncher) -> None:
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "forged-call"), {})
    assert final.kind == "return", final
    assert final.value == {"refused": True, "kind": "pie-error", "message": "no host call 987654 is pending"}


def test_a_js_inferlet_cannot_import_wasi_directly(cache: Path, launcher: WasmLauncher) -> None:
    with pytest.raises(InvalidInput, match="esbuild could not bundle"):
        js_component_path(PROGRAMS / "wasi-import", "index.js", cache)


def test_a_host_error_ends_the_run_with_its_kind_and_message(engine: Engine, launcher: WasmLauncher) -> None:
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "throws"), {})
    assert final.kind == "error"
    assert final.value.startswith("PieError: ") and "no-such-model" in final.value, final.value


def test_a_dependency_other_than_the_sdk_is_refused_before_npm_runs(cache: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "Pie.toml").write_text('[package]\nname = "x"\n')
        (folder / "index.js").write_text("export async function main() { return 1; }\n")
        (folder / "package.json").write_text(
            '{"name": "x", "dependencies": {"inferlet": "*", "left-pad": "1.3.0"},'
            ' "scripts": {"postinstall": "touch pwned"}}')
        with pytest.raises(InvalidInput, match="left-pad"):
            js_component_path(folder, "index.js", cache)
        assert not (folder / "pwned").exists() and not (folder / "node_modules").exists()


def test_a_link_in_the_folder_is_refused(cache: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "Pie.toml").write_text('[package]\nname = "x"\n')
        (folder / "index.js").write_text("export async function main() { return 1; }\n")
        (folder / "secret.js").symlink_to("/etc/passwd")
        with pytest.raises(InvalidInput, match="symbolic link"):
            js_component_path(folder, "index.js", cache)


def test_the_same_sources_build_once(cache: Path, launcher: WasmLauncher) -> None:
    folder = EXAMPLES / "text-completion-ts"
    first = js_component_path(folder, "index.ts", cache)
    built = first.stat().st_mtime_ns
    assert js_component_path(folder, "index.ts", cache) == first and first.stat().st_mtime_ns == built


def test_json_extraction_ts_returns_what_the_python_twin_does(engine: Engine, launcher: WasmLauncher) -> None:
    args = {"max_tokens": 96}
    py_final, _ = _inproc(engine, load_manifest(EXAMPLES / "json-extraction"), args)
    js_final, _ = _run(engine, launcher, load_manifest(EXAMPLES / "json-extraction-ts"), args)
    assert py_final.kind == "return", py_final
    assert js_final == py_final
    assert engine.pools_whole()


def test_a_js_decode_loop_runs_ahead_like_the_python_sdk(engine: Engine, launcher: WasmLauncher) -> None:
    """After its first pass a plain decode step is one ``forward_next`` (the engine ran it ahead),
    never a new ``forward``."""
    from pie_core.runtime import host_api

    before = dict(host_api.CALLS)
    final, _ = _run(engine, launcher, load_manifest(EXAMPLES / "text-completion-ts"), {"prompt": "Hi.", "max_tokens": 20})
    assert final == Event("return", {"tokens": 20})
    calls = {k: host_api.CALLS[k] - before.get(k, 0) for k in host_api.CALLS}
    assert calls.get(("inference", "forward"), 0) == 1
    assert calls.get(("inference", "forward_next"), 0) >= 1


def test_session_runtime_messaging_and_market_reach_a_js_guest(engine: Engine, launcher: WasmLauncher) -> None:
    from pie_core import __version__

    events: list[Event] = []
    inst = HostInstance(engine=engine, emit=events.append, username="alice")
    inst.inbox.put_nowait("from the client")

    async def main() -> Event:
        return await launcher.start(engine, load_manifest(PROGRAMS / "io"), {}, inst)

    final = asyncio.run(main())
    assert final.kind == "return", final
    value = final.value
    assert value["got"] == ["first", "second"] and value["pulled"] == "job-1" and value["reply"] == "from the client"
    assert value["topic"] == "news" and value["models"] == list(engine.models) and value["user"] == "alice"
    assert value["version"] == __version__ and value["seqLen"] > 0 and value["price"] and value["balance"]
    assert [e.value for e in events if e.kind == "stdout"][:2] == ["hello", '{"n":1}']
    assert engine.pools_whole()


def test_a_js_inferlet_run_in_process_ends_with_where_it_runs(engine: Engine) -> None:
    final, _ = _inproc(engine, load_manifest(EXAMPLES / "text-completion-ts"), {"max_tokens": 2})
    assert final.kind == "error" and "runs only in the wasm sandbox" in final.value, final


def test_a_js_guest_reaches_no_file_outside_its_scratch_directory_and_sees_its_own_paths(engine: Engine, launcher: WasmLauncher) -> None:
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "escape"), {})
    assert final.kind == "return", final
    value = final.value
    assert (value["inside"], value["dir"]) == ("/scratch/notes/a.txt", "/scratch"), value  # the guest's paths
    assert (value["sdkPath"], value["sdkDir"], value["sdkEscape"]) == (
        "/scratch/notes/b.txt", "/scratch", "refused: invalid-input"), value
    assert final.value["../../etc/passwd"].startswith("refused: ") and final.value["/etc/passwd"].startswith("refused: ")
    # and WASI's filesystem is out of reach: a static import does not bundle (above), a computed
    # one is a native promise that never settles in the sandbox
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "dynamic-wasi"), {})
    assert final.kind == "error" and "can never finish" in final.value, final


def test_without_node_the_build_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from pie_core.runtime.wasm import js_build

    monkeypatch.setattr(js_build.shutil, "which", lambda tool: None)
    missing = js_build.js_toolchain_missing()
    assert missing is not None and "\n" not in missing and "Node.js" in missing and "npm" in missing


def test_tools_helpers_match_the_python_sdk(engine: Engine, launcher: WasmLauncher) -> None:
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "tools"), {})
    want, _ = _inproc(engine, load_manifest(PROGRAMS / "tools-py"), {})
    assert want.kind == "return" and final == want, (final, want)
    assert want.value["equip"] and want.value["answer"] and want.value["matcher"] is True


def test_a_static_logit_mask_matches_the_python_sdk_and_an_adapter_runs(engine: Engine, launcher: WasmLauncher) -> None:
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "options"), {})
    want, _ = _inproc(engine, load_manifest(PROGRAMS / "options-py"), {})
    assert want.kind == "return" and final == want, (final, want)
    assert all(1000 <= t < 1050 for t in want.value["masked"]) and len(want.value["adapted"]) == 6
    # a new adapter is all zeros, so "adapted" shows only that a pass with an adapter runs


def test_the_guest_gets_the_values_its_generated_host_types_say(engine: Engine, launcher: WasmLauncher) -> None:
    """sdk/javascript/src/host maps jco's guest types to componentize-qjs's values: u64 is a
    number, a list of u32 an array, bytes a Uint8Array, option none null."""
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "host-values"), {})
    assert final == Event("return", {"u64": "number", "listU32": "array", "listU8": "Uint8Array",
                                     "optionNone": "null", "pollIndices": "array"}), final


@pytest.mark.parametrize("mode", ["chat", "text"])
def test_agent_react_ts_returns_what_the_python_twin_does(engine: Engine, launcher: WasmLauncher, mode: str) -> None:
    args = {"turns": 3, "max_tokens": 12, "tool_delay_s": 0.02, "mode": mode}
    py_final, _ = _inproc(engine, load_manifest(EXAMPLES / "agent-react"), args)
    js_final, _ = _run(engine, launcher, load_manifest(EXAMPLES / "agent-react-ts"), args)
    assert py_final.kind == "return" and js_final.kind == "return", (py_final, js_final)
    assert js_final.value == json.loads(json.dumps(py_final.value))  # as the client gets it (tuples are lists)
    assert py_final.value["turns"] == 3 and all("observation" in turn for turn in py_final.value["log"])
    assert engine.pools_whole(), "the agent left KV pages allocated"


_REACT_TEXTS = [
    "Thought: find it.\nAction: search[Eiffel Tower]\nAction: lookup[ 1889 ]\nAction: search[statue of liberty]",
    "Action: Lookup[completed]", "Action: finish[3 years]", "Action:\u2003SEARCH[new  york\u3000city]",
    "😀 no action here,\x1cjust\u2029words \u00a0 and more words than sixty characters in a row, 😀 emoji", "",
    "Action: unknown[x]", "Action: search[paris kv]", "Action: search[zzz]", "Action: lookup[]",
]


def test_agent_react_ts_protocol_matches_react_py(cache: Path, launcher: WasmLauncher, tmp_path: Path) -> None:
    """react.ts parses actions, runs tools and words observations as react.py does, on texts the
    dummy model never writes (actions, lookups, finish, Python's whitespace, code points)."""
    import subprocess
    import sys

    from pie_core.runtime.wasm import js_build

    sys.path.insert(0, str(EXAMPLES / "agent-react"))
    try:
        import react
    finally:
        sys.path.pop(0)
    esbuild = js_build._toolchain(cache) / "node_modules" / ".bin" / "esbuild"
    bundle = tmp_path / "react.mjs"
    subprocess.run([str(esbuild), str(EXAMPLES / "agent-react-ts" / "react.ts"), "--bundle", "--format=esm",
                    "--platform=node", f"--outfile={bundle}", "--log-level=error"], check=True, timeout=60)
    script = ("const r = await import(process.argv[1]); const out = [];"
              "for (const t of JSON.parse(process.argv[2])) { const tools = new r.Tools(0); const calls = r.actions(t, 2);"
              "  out.push([calls, r.finished(calls), r.observation(await tools.run(calls)), r.search(t)]); }"
              "console.log(JSON.stringify(out));")
    done = subprocess.run(["node", "--input-type=module", "-e", script, bundle.as_uri(), json.dumps(_REACT_TEXTS)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]

    async def python_side() -> list[Any]:
        out = []
        for text in _REACT_TEXTS:
            tools, calls = react.Tools(0), react.actions(text, 2)
            out.append([calls, react.finished(calls), react.observation(await tools.run(calls)), react.search(text)])
        return out

    want = json.loads(json.dumps(asyncio.run(python_side())))
    assert json.loads(done.stdout) == want
    assert any("lookup" in str(row[0]) and "1889" in row[2] for row in want)  # the texts reach every tool


def test_decoders_tools_speculation_horizon_and_zo_match_the_python_sdk(engine: Engine, launcher: WasmLauncher) -> None:
    """reasoning.Decoder, tools.Decoder/parseCall, ctx.equipTools/answerTool, a Speculator
    (draft/accept/rollback), systemSpeculation, horizon and zo give what the Python SDK gives."""
    from pie_core.runtime import host_api

    def horizons() -> int:
        return host_api.CALLS[("scheduling", "set_horizon")]

    before = horizons()
    want, _ = _inproc(engine, load_manifest(PROGRAMS / "gaps-py"), {})
    py_horizons, before = horizons() - before, horizons()
    final, _ = _run(engine, launcher, load_manifest(PROGRAMS / "gaps"), {})
    assert want.kind == "return", want
    assert final.kind == "return", final
    assert final.value == json.loads(json.dumps(want.value))
    value = want.value
    assert [e["type"] for e in value["reasoning"]].count("end") == 2 and value["reasoningBatch"]["type"] == "end"
    assert value["toolEvents"][-1] == {"type": "call", "name": "weather", "args": '{"city": "Paris"}'}, value["toolEvents"]
    assert [t for step in value["speculator"][0] for t in step] == value["reference"] == value["system"][0]
    assert any(call[0] == "rollback" for call in value["speculator"][1]) and value["both"] is True
    plain, sped, calls = value["grammar"]
    assert plain == sped == value["grammarSystem"] and any(c[0] == "rollback" for c in calls), value["grammar"]
    assert horizons() - before == py_horizons > 0  # the market hears the same horizons
    assert engine.pools_whole()
