"""Inferlets call engine-configured stdio MCP servers through ``inferlet.mcp``."""

import asyncio
import json
import os
import signal
import sys

import pytest

from inferlet import mcp
from pie_core.engine.engine import Engine
from pie_core.errors import InvalidInput, NotFound

from mcp_harness import fixture_entry, run, value, write_servers


def test_available_servers_lists_the_configured_servers_without_starting_them(engine):
    async def main(_):
        return {"names": mcp.available_servers(), "live": engine.mcp.live_servers()}

    assert value(engine, main) == {"names": ["calc"], "live": []}


def test_session_calls_return_the_raw_results_as_json(engine):
    async def main(_):
        with mcp.connect("calc") as calc:
            return {
                "tools": json.loads(await calc.list_tools()),
                "add": json.loads(await calc.call_tool("add", {"a": 2, "b": 3})),
                "add_json_args": json.loads(await calc.call_tool("add", '{"a": 40, "b": 2}')),
                "resources": json.loads(await calc.list_resources()),
                "greeting": json.loads(await calc.read_resource("pie://greeting")),
                "prompts": json.loads(await calc.list_prompts()),
                "review": json.loads(await calc.get_prompt("review", {"code": "x = 1"})),
            }

    out = value(engine, main)
    add = next(t for t in out["tools"]["tools"] if t["name"] == "add")
    assert add["inputSchema"]["required"] == ["a", "b"]
    assert out["add"]["isError"] is False
    assert out["add"]["content"] == [{"type": "text", "text": "5"}]
    assert out["add"]["structuredContent"] == {"result": 5}
    assert out["add_json_args"]["structuredContent"] == {"result": 42}
    assert [r["uri"] for r in out["resources"]["resources"]] == ["pie://greeting"]
    assert out["greeting"]["contents"][0]["text"] == "hello from the fixture"
    assert [p["name"] for p in out["prompts"]["prompts"]] == ["review"]
    assert out["review"]["messages"][0]["content"]["text"] == "Please review this code:\nx = 1"


def test_failures_are_clear_errors_and_leave_the_session_usable(engine):
    async def main(_):
        errors = {}
        calc = mcp.connect("calc")
        for label, call in {
            "tool_error": lambda: calc.call_tool("fail", {"reason": "disk on fire"}),
            "unknown_tool": lambda: calc.call_tool("nosuch", {}),
            "unknown_resource": lambda: calc.read_resource("pie://missing"),
            "args_not_object": lambda: calc.call_tool("add", "[1, 2]"),
            "prompt_args_not_text": lambda: calc.get_prompt("review", {"code": 7}),
        }.items():
            try:
                await call()
            except Exception as exc:  # noqa: BLE001
                errors[label] = (type(exc).__name__, str(exc))
        errors["after"] = json.loads(await calc.call_tool("add", {"a": 1, "b": 1}))["structuredContent"]
        return errors

    out = value(engine, main)
    kind, message = out["tool_error"]
    assert kind == "McpError" and message.startswith("tool 'fail' on MCP server 'calc' failed:")
    assert message.endswith("disk on fire")
    assert out["unknown_tool"][0] == "McpError" and "nosuch" in out["unknown_tool"][1]
    assert out["unknown_resource"][0] == "McpError" and "pie://missing" in out["unknown_resource"][1]
    assert out["args_not_object"][0] == "InvalidInput" and "JSON object" in out["args_not_object"][1]
    assert out["prompt_args_not_text"][0] == "InvalidInput" and "code" in out["prompt_args_not_text"][1]
    assert out["after"] == {"result": 2}


def test_unknown_server_is_not_found_and_lists_the_available_ones(engine):
    async def main(_):
        try:
            mcp.connect("weather")
        except NotFound as exc:
            return str(exc)

    message = value(engine, main)
    assert "'weather'" in message and "available: calc" in message and "[mcp.servers.NAME]" in message


def test_a_server_that_dies_fails_the_call_and_the_next_call_starts_it_again(engine):
    async def main(_):
        calc = mcp.connect("calc")
        first = json.loads(await calc.call_tool("pid"))["structuredContent"]["result"]
        try:
            await calc.call_tool("die", {"code": 3})
        except mcp.McpError as exc:
            died = str(exc)
        second = json.loads(await calc.call_tool("pid"))["structuredContent"]["result"]
        return first, died, second

    async def other(_):  # an inferlet that only starts once the server has died
        await asyncio.sleep(0)
        return "still serving"

    ((final, _),) = run(engine, main)
    assert final.kind == "return", final.value
    first, died, second = final.value
    assert "MCP server 'calc' exited during tools/call" in died
    assert "fixture server exiting with code 3" in died  # the tail of its stderr log
    assert first != second and engine.mcp.connection("calc").starts == 2
    assert run(engine, other)[0][0].value == "still serving"


def test_a_server_that_cannot_start_is_a_clear_error(pie_home, engine):
    write_servers(pie_home, {
        "missing": {"command": str(pie_home / "no-such-server")},
        "crashes": {"command": fixture_entry()["command"], "args": ["-c", "import sys; sys.exit('bad API token')"]},
    })

    async def main(_):
        messages = {}
        for name in ("missing", "crashes"):
            try:
                await mcp.connect(name).list_tools()
            except mcp.McpError as exc:
                messages[name] = str(exc)
        return messages

    out = value(engine, main)
    assert out["missing"].startswith("MCP server 'missing' failed to start")
    assert "[mcp.servers.missing]" in out["missing"]
    assert "MCP server 'crashes' failed to start" in out["crashes"] and "bad API token" in out["crashes"]


def test_one_process_serves_concurrent_inferlets(engine):
    async def main(_):
        with mcp.connect("calc") as calc:
            return json.loads(await calc.call_tool("pid"))["structuredContent"]["result"]

    results = run(engine, main, main, main)
    pids = {final.value for final, _ in results}
    assert len(pids) == 1 and engine.mcp.connection("calc").starts == 1


def test_engine_close_stops_the_server_process(engine):
    async def main(_):
        return json.loads(await mcp.connect("calc").call_tool("pid"))["structuredContent"]["result"]

    async def go():
        from pie_core.runtime.instance import run_main

        final = await run_main(engine, main, {}, lambda e: None)
        live = engine.mcp.live_servers()
        await engine.close()
        return final.value, live

    pid, live_before = asyncio.run(go())
    assert live_before == ["calc"] and engine.mcp.live_servers() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_sessions_close_when_the_inferlet_ends_or_leaves_the_with_block(engine):
    kept = []

    async def main(_):
        with mcp.connect("calc") as scoped:
            pass
        try:
            await scoped.list_tools()
        except InvalidInput as exc:
            closed_message = str(exc)
        kept.append(mcp.connect("calc"))
        return closed_message

    assert "closed" in value(engine, main)
    assert kept[0]._h.closed


def test_a_cancelled_call_leaves_the_connection_usable(engine):
    async def main(_):
        calc = mcp.connect("calc")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(calc.call_tool("sleep", {"seconds": 30}), 0.5)
        return json.loads(await calc.call_tool("add", {"a": 3, "b": 4}))["structuredContent"]

    assert value(engine, main) == {"result": 7}


def test_a_request_past_the_configured_timeout_is_an_error(pie_home, engine):
    write_servers(pie_home, {"slow": fixture_entry(timeout=0.5)})

    async def main(_):
        try:
            await mcp.connect("slow").call_tool("sleep", {"seconds": 5})
        except mcp.McpError as exc:
            return str(exc)

    message = value(engine, main)
    assert "did not answer tools/call within 0.5s" in message and "[mcp.servers.slow] timeout" in message


def test_a_server_that_dies_while_idle_is_replaced_on_the_next_call(engine):
    async def main(_):
        calc = mcp.connect("calc")
        first = json.loads(await calc.call_tool("pid"))["structuredContent"]["result"]
        os.kill(first, signal.SIGKILL)
        for _ in range(200):  # the engine notices the closed pipe on its own
            if not engine.mcp.live_servers():
                break
            await asyncio.sleep(0.01)
        second = json.loads(await calc.call_tool("pid"))["structuredContent"]["result"]
        return first, second

    first, second = value(engine, main)
    assert first != second and engine.mcp.connection("calc").starts == 2


MUTE = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"


def test_closing_the_engine_while_a_server_starts_cancels_the_start_and_ends_the_process(pie_home):
    # The server never answers initialize: close can only return by cancelling the start (waiting
    # for it would last the 30 s start-up allowance).
    pid_file = pie_home / "mute.pid"
    write_servers(pie_home, {"mute": {"command": sys.executable, "args": ["-c", MUTE, str(pid_file)]}})
    engine = Engine("dummy")

    async def go():
        engine.mcp.open("mute")  # starts the process in the background
        starting = engine.mcp.connection("mute")._task
        for _ in range(3000):  # a hang bound only: until the process is up
            if pid_file.is_file() and pid_file.read_text():
                break
            await asyncio.sleep(0.01)
        await asyncio.wait_for(engine.close(), 60)  # a hang bound only
        return starting, int(pid_file.read_text())

    starting, pid = asyncio.run(go())
    assert starting.cancelled() and engine.mcp.live_servers() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ended and reaped
