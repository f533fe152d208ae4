"""Nothing one user sends stalls the server for the others: grammar compilation reached through
the HTTP ``tools`` path and ``response_format``, large request bodies, and values with shared
references on a worker's pipe are all handled off the event loop, bounded, while ``/health``
and alice keep being answered within 0.5 s."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # wasm_helpers

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.runtime.launcher import InProcessLauncher
from stall import worst_health_during
from test_http import CHAT, post

PATTERN_TOOLS = [{"type": "function", "function": {
    "name": "spell", "description": "x",
    "parameters": {"type": "object", "properties": {"w": {"type": "string", "pattern": "(a|b|c|d){1,2000}x"}},
                   "required": ["w"]}}}]
def _wasm() -> object:
    from wasm_helpers import shared_launcher

    from pie_core.runtime.wasm.host import GuestLimits
    from pie_core.runtime.wasm.launcher import WasmLauncher

    return WasmLauncher(GuestLimits(wall_s=30.0, memory_mb=512), host=asyncio.run(shared_launcher().host()))


LAUNCHERS = {"in-process": lambda: InProcessLauncher(), "process": lambda: "process", "wasm": _wasm}


def _chat(extra: dict) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


async def _victim_is_served_after(s: Served) -> float:
    """How long alice waits for her probe after an attack; asked twice when the first wait is
    long: the attack's garbage can cost a loaded CI machine one pause, a server left slow stays
    slow."""
    took = await victim_is_served(s)
    return took if took < 0.5 else await victim_is_served(s)


@pytest.mark.parametrize("runner", sorted(LAUNCHERS))
@pytest.mark.parametrize("attack", ["tools-required", "response-format"])
def test_a_slow_grammar_over_http_does_not_stall_other_users(hostile, runner: str, attack: str) -> None:
    if attack == "tools-required":
        body = _chat({"tools": PATTERN_TOOLS, "tool_choice": "required"})
    else:
        schema = PATTERN_TOOLS[0]["function"]["parameters"]
        body = _chat({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})

    async def scenario(s: Served) -> None:
        await victim_is_served(s)  # warm: alice's program installed, the zygote up
        worst, (status, reply) = await worst_health_during(s, post(s, CHAT, body, s.tokens["mallory"]))
        assert worst < 0.5, f"/health waited {worst:.2f}s while mallory's grammar compiled"
        assert status in (200, 400), reply
        assert await _victim_is_served_after(s) < 0.5

    hostile(scenario, launcher=LAUNCHERS[runner]())


@pytest.mark.parametrize("runner", sorted(LAUNCHERS))
def test_a_large_tools_body_is_parsed_off_the_loop_and_refused_before_any_grammar(hostile, runner: str) -> None:
    tool = PATTERN_TOOLS[0]["function"]
    tools = [{"type": "function", "function": {**tool, "name": f"t{i}", "description": "d" * 28_000}}
             for i in range(128)]
    body = json.dumps(_chat({"tools": tools, "tool_choice": "required"})).encode()
    assert 3_500_000 < len(body) < 4 * 2**20

    async def scenario(s: Served) -> None:
        await victim_is_served(s)
        worst, (status, reply) = await worst_health_during(s, post(s, CHAT, body, s.tokens["mallory"]))
        assert worst < 0.5, f"/health waited {worst:.2f}s while mallory's {len(body)}-byte body was handled"
        assert status == 400 and reply["error"]["param"] == "tools", reply
        assert await _victim_is_served_after(s) < 0.5

    hostile(scenario, launcher=LAUNCHERS[runner]())


SHARER = '''
import gc
from inferlet import session


def shared(depth):
    value = [1]
    for _ in range(depth):
        value = [value, value]  # one list referenced twice at every level: 2**depth lists once encoded
    return value


async def main(input):
    session.send("holding")
    if input["how"] == "argument":  # a raw call frame: the SDK's own argument checks are skipped
        link = next(o for o in gc.get_objects() if type(o).__name__ == "_Link")
        link.send(["call", 999, "session", "send", [shared(input["depth"])]])
    return shared(input["depth"])
'''


@pytest.mark.parametrize("how", ["argument", "return", "wasm-return"])
@pytest.mark.parametrize("depth", [19, 21, 23])
def test_values_with_shared_references_on_the_worker_pipe_do_not_stall_the_server(hostile, tmp_path: Path,
                                                                                 depth: int, how: str) -> None:
    program = write_program(tmp_path / "sharer", SHARER, name="sharer",
                            parameters='how = { type = "string" }\ndepth = { type = "int" }')

    async def scenario(s: Served) -> None:
        await victim_is_served(s)
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            name = await mallory.install(program)

            async def attack() -> list:
                proc = await mallory.launch(name, {"how": how.removeprefix("wasm-"), "depth": depth})
                try:
                    return [e async for e in proc.events()]
                except ConnectionError as exc:  # a return value past the client's 8 MiB frames (wasm copies it whole)
                    assert "message too big" in str(exc) and how.startswith("wasm"), exc
                    return []

            worst, events = await worst_health_during(s, attack())
            if worst >= 0.5:  # a real stall comes back on a second try; a hiccup of a loaded CI machine does not
                worst, events = await worst_health_during(s, attack())
        assert worst < 0.5, f"/health waited {worst:.2f}s while the server handled mallory's {depth}-deep value"
        assert not events or events[-1].kind == "error", events[-1]  # refused: too many containers, or too large
        assert await _victim_is_served_after(s) < 0.5

    hostile(scenario, **({"launcher": _wasm()} if how.startswith("wasm") else {}))


def test_a_wasm_return_value_is_bounded_by_counting_outside_its_strings() -> None:
    from pie_core.runtime.wasm.host import MAX_RETURN_CONTAINERS, _returned

    brackets_in_text = json.dumps({"code": "[{" * MAX_RETURN_CONTAINERS})
    assert _returned(brackets_in_text).ok  # brackets inside a string are not containers
    nested = json.dumps([[1]] * (MAX_RETURN_CONTAINERS + 1))
    refused = _returned(nested)
    assert not refused.ok and "lists and dicts" in refused.value


TOOL_GRAMMAR = '''
import json
from inferlet import Model, runtime, session, tools


async def main(input):
    model = Model.load(runtime.models()[0])
    try:
        grammar = tools.native_grammar(model, json.loads(input["tools"]), choice="required")
        return "none" if grammar is None else "built"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
'''


@pytest.mark.parametrize("runner", ["process", "wasm"])
def test_a_tool_grammar_built_by_a_sandboxed_inferlet_does_not_stall_the_server(hostile, tmp_path: Path,
                                                                                 runner: str) -> None:
    program = write_program(tmp_path / "tools", TOOL_GRAMMAR, name="tools", parameters='tools = { type = "string" }')

    async def scenario(s: Served) -> None:
        await victim_is_served(s)
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            name = await mallory.install(program)

            async def attack() -> object:
                return await (await mallory.launch(name, {"tools": json.dumps(PATTERN_TOOLS)})).wait()

            worst, result = await worst_health_during(s, attack())
        assert worst < 0.5, f"/health waited {worst:.2f}s while mallory's tool grammar was built"
        assert result in ("built", "none") or "InvalidInput" in str(result), result
        assert await _victim_is_served_after(s) < 0.5

    hostile(scenario, launcher=LAUNCHERS[runner]())


def test_one_users_slow_off_loop_calls_leave_the_other_threads_to_everyone_else() -> None:
    import threading
    import time

    from pie_core.host.binding import run_off_loop_as

    release = threading.Event()

    async def main() -> float:
        slow = [asyncio.ensure_future(run_off_loop_as("mallory", release.wait, 10)) for _ in range(4)]
        await asyncio.sleep(0.1)
        start = time.monotonic()
        await asyncio.wait_for(run_off_loop_as("alice", lambda: None), 5)
        took = time.monotonic() - start
        release.set()
        await asyncio.wait_for(asyncio.gather(*slow), 30)
        return took

    assert asyncio.run(main()) < 0.5


def test_one_users_slow_compilations_leave_the_other_compile_thread_to_everyone_else(security_engine) -> None:
    import threading
    import time

    from pie_core.grammar import compiler

    release = threading.Event()
    slow = [compiler._in_turn("mallory", lambda: release.wait(10)) for _ in range(4)]
    start = time.monotonic()
    compiler._in_turn("alice", lambda: None).result(timeout=5)
    took = time.monotonic() - start
    release.set()
    assert all(f.result(timeout=10) for f in slow)
    assert took < 0.5, f"alice's compilation waited {took:.2f}s behind mallory's"


def test_a_call_cancelled_while_queued_gives_its_users_turn_back() -> None:
    """A caller that stops waiting (a request's timeout) cancels its queued call, which then
    never runs: its user's turn must come back anyway, or every later call of that user waits
    forever (it once hung the suite after a slow-grammar test)."""
    import threading
    import time

    from pie_core.host.binding import OFF_LOOP_THREADS, run_off_loop_as

    release = threading.Event()

    async def main() -> float:
        busy = [asyncio.ensure_future(run_off_loop_as(f"busy{i}", release.wait, 10)) for i in range(OFF_LOOP_THREADS)]
        await asyncio.sleep(0.1)  # every thread taken: mallory's call stays queued
        queued = asyncio.ensure_future(run_off_loop_as("mallory", lambda: None))
        await asyncio.sleep(0.1)
        queued.cancel()
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(*busy)
        start = time.monotonic()
        await asyncio.wait_for(run_off_loop_as("mallory", lambda: None), 3)
        return time.monotonic() - start

    assert asyncio.run(main()) < 0.5


def test_threads_doing_users_heavy_work_run_below_the_servers_priority() -> None:
    """The off-loop threads and the grammar compiler's run at nice +10 (Linux renices threads):
    a user's grammar compilation or big frame yields the CPU to the event loop and the backend.
    Checked in a fresh interpreter: the pools are made once per process, and whatever reniced this
    one's main thread since (a CI harness does) would change the premise, not the code."""
    import subprocess
    import sys

    program = (
        "import asyncio, os, threading\n"
        "from pie_core.grammar import compiler\n"
        "from pie_core.host.binding import run_off_loop_as\n"
        "from pie_core.threads import USER_WORK_NICE\n"
        "nice = lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "base = nice()\n"
        "off_loop = asyncio.run(run_off_loop_as('mallory', nice))\n"
        "compiling = compiler._in_turn('mallory', nice).result(timeout=5)\n"
        "print(base, off_loop, compiling, nice(), min(19, base + USER_WORK_NICE))\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    base, off_loop, compiling, after, expected = map(int, out.stdout.split())
    assert off_loop == compiling == expected and after == base
