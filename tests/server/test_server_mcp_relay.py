"""MCP servers a client registers reach the inferlets it launches, over the WebSocket."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

import msgpack
import pytest
from conftest import TOKENS, Served
from mcp import StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from server_helpers import raw_connect, raw_request, wait_until

from pie_core.client import ProcessFailed, ServerError, connect, connect_sync
from pie_core.mcp import McpError
from pie_core.runtime.process import ProcessLauncher, WorkerLimits
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

MCP_PROBE = Path(__file__).parent / "inferlets" / "mcp-probe"
FIXTURE_SERVER = Path(__file__).parents[1] / "mcp" / "fixture_server.py"


def notes_server() -> MCPServer:
    """A server only the client has: two tools and a resource."""
    server = MCPServer("client-notes", log_level="WARNING")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case ``text``."""
        return text.upper()

    @server.tool()
    def boom(reason: str) -> str:
        """Always fails."""
        raise ToolError(reason)

    @server.resource("notes://today", mime_type="text/plain")
    def today() -> str:
        """Today's note."""
        return "buy milk"

    return server


async def _run(client, program, **args):
    return await (await client.launch(program, {k: json.dumps(v) if k == "args" else v for k, v in args.items()})).wait()


def _hang(blocked: asyncio.Event):
    """A handler that never answers (it sets ``blocked`` when a call arrives)."""

    async def handler(method, params):
        blocked.set()
        await asyncio.Event().wait()

    return handler


async def _exchange(ws, frame: dict, other: list[dict]) -> dict:
    """Send a request and return its response; frames that arrive first go to ``other``."""
    await ws.send(msgpack.packb(frame, use_bin_type=True))
    while True:
        got = msgpack.unpackb(await ws.recv(), raw=False)
        if got.get("type") == "response" and got.get("id") == frame["id"]:
            return got
        other.append(got)


def test_an_inferlet_lists_and_calls_a_server_its_client_registered(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            program = await alice.install(MCP_PROBE)
            assert await alice.register_mcp_server("notes", notes_server()) == ["notes"]
            assert "notes" in await _run(alice, program, mode="list")
            called = await _run(alice, program, mode="call", target="shout", args={"text": "hi"})
            assert called == {"tools": ["shout", "boom"], "text": "HI"}
            assert await _run(alice, program, mode="read", target="notes://today") == "buy milk"

    served(scenario)


def test_a_stdio_server_the_client_started_is_reached_through_the_client(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            program = await alice.install(MCP_PROBE)
            fixture = StdioServerParameters(command=sys.executable, args=[str(FIXTURE_SERVER)])
            await alice.register_mcp_server("calc", fixture)
            called = await _run(alice, program, mode="call", server="calc", target="add", args={"a": 2, "b": 40})
            assert called["text"] == "42" and "pid" in called["tools"]
            assert await alice.unregister_mcp_server("calc") == []
            assert "calc" not in await _run(alice, program, mode="list")

    served(scenario)


def test_client_side_failures_reach_the_inferlet_as_mcp_errors(served):
    async def scenario(s):
        async def broken(method, params):
            raise RuntimeError("the local index is corrupt")

        async with await connect(s.url, s.tokens["alice"]) as alice:
            program = await alice.install(MCP_PROBE)
            await alice.register_mcp_server("notes", notes_server())
            await alice.register_mcp_server("broken", broken)
            tool_failed = await _run(alice, program, mode="catch", target="boom", args={"reason": "disk full"})
            assert tool_failed == "McpError: tool 'boom' on MCP server 'notes' failed: Error executing tool boom: disk full"
            unknown = r"answered resources/read with an error: Unknown resource: notes://nope \(code -32602\)"
            with pytest.raises(ProcessFailed, match=unknown):
                await _run(alice, program, mode="read", target="notes://nope")
            handler_failed = await _run(alice, program, mode="catch", server="broken", target="any")
            assert handler_failed == ("McpError: MCP server 'broken' (registered by the client) answered tools/call "
                                      "with an error: RuntimeError: the local index is corrupt")

    served(scenario)


def test_a_call_the_client_never_answers_fails_after_its_time_limit(served):
    async def scenario(s):
        blocked = asyncio.Event()
        async with await connect(s.url, s.tokens["alice"]) as alice:
            program = await alice.install(MCP_PROBE)
            await alice.register_mcp_server("slow", _hang(blocked), timeout=0.3)
            result = await _run(alice, program, mode="catch", server="slow", target="wait")
            assert blocked.is_set()
            assert result == ("McpError: MCP server 'slow' (registered by the client) did not answer tools/call "
                              "within 0.3s (the client sets the limit with mcp_register's 'timeout')")

    served(scenario)


def test_unregistering_fails_calls_in_flight_and_later_registrations_reach_running_processes(served):
    async def scenario(s):
        blocked = asyncio.Event()
        async with await connect(s.url, s.tokens["alice"]) as alice:
            program = await alice.install(MCP_PROBE)
            waiting = await alice.launch(program, {"mode": "list-later"})
            await alice.register_mcp_server("slow", _hang(blocked))
            await waiting.send("go")
            assert "slow" in await waiting.wait()
            calling = await alice.launch(program, {"mode": "catch", "server": "slow", "target": "wait"})
            await asyncio.wait_for(blocked.wait(), 10)
            assert await alice.unregister_mcp_server("slow") == []
            assert await calling.wait() == ("McpError: MCP server 'slow' (registered by the client) did not answer "
                                            "tools/call: the client unregistered it")

    served(scenario)


def test_a_server_the_client_cannot_open_or_use_is_refused_at_registration(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            with pytest.raises(McpError, match="could not open MCP server 'gone' on this client: .*no-such-mcp-server"):
                await alice.register_mcp_server("gone", StdioServerParameters(command="/no-such-mcp-server"))
            with pytest.raises(TypeError, match=r"register_mcp_server\('n', ...\) takes an open mcp.Client .* got int"):
                await alice.register_mcp_server("n", 42)
            with pytest.raises(ServerError, match="invalid_input: MCP server names are 1-64 characters"):
                await alice.register_mcp_server("no spaces", lambda method, params: {})
            assert await alice.register_mcp_server("ok", lambda method, params: {}) == ["ok"]

    served(scenario)


def test_a_client_that_disconnects_mid_call_fails_the_call_and_pages_come_back(served):
    async def scenario(s):
        blocked = asyncio.Event()
        async with await connect(s.url, s.tokens["alice"]) as watcher:
            program = await watcher.install(MCP_PROBE)
            owner = await connect(s.url, s.tokens["alice"])
            await owner.register_mcp_server("slow", _hang(blocked))
            detached = await owner.launch(program, {"mode": "catch", "server": "slow", "target": "wait"}, detached=True)
            await asyncio.wait_for(blocked.wait(), 10)
            blocked.clear()
            owned = await owner.launch(program, {"mode": "catch", "server": "slow", "target": "wait"})
            await asyncio.wait_for(blocked.wait(), 10)
            assert s.server.engine.pools_whole() is False
            await owner.close()
            events = [(e.kind, e.value) async for e in (await watcher.attach(detached.id)).events()]
            assert events == [("stdout", "calling"), ("return", "McpError: MCP server 'slow' (registered by the client) "
                                                                 "did not answer tools/call: the client disconnected")]
            await wait_until(lambda: len(s.server.processes) == 0)
            assert "slow" not in s.server.engine.mcp.available(owned.id)
            assert s.server.engine.pools_whole()

    served(scenario)


def test_registered_names_belong_to_one_connection(served):
    async def scenario(s):
        async with (await connect(s.url, s.tokens["alice"]) as alice, await connect(s.url, s.tokens["alice"]) as alice2,
                    await connect(s.url, s.tokens["bob"]) as bob):
            program = await alice.install(MCP_PROBE)
            await bob.install(MCP_PROBE)
            await alice.register_mcp_server("notes", notes_server())
            assert "notes" in await _run(alice, program, mode="list")
            assert "notes" not in await _run(alice2, program, mode="list")
            assert "notes" not in await _run(bob, program, mode="list")
            with pytest.raises(ProcessFailed, match="NotFound: no MCP server named 'notes'"):
                await _run(bob, program, mode="call", target="shout", args={"text": "x"})
            with pytest.raises(ServerError, match="invalid_input: this connection registered no MCP server named 'notes'"):
                await alice2.unregister_mcp_server("notes")

    served(scenario)


def test_the_frames_of_a_relayed_call_and_bad_answers(served):
    """The wire format itself: an mcp_request frame out, mcp_result requests back."""

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as installer:
            program = await installer.install(MCP_PROBE)
        async with raw_connect(s.url, s.tokens["alice"]) as ws:
            other: list[dict] = []
            reply = await _exchange(ws, {"type": "mcp_register", "id": 1, "servers": ["echo"], "timeout": 30}, other)
            assert reply["result"] == {"servers": ["echo"]}
            launch = {"type": "launch", "id": 2, "program": program,
                      "input": {"mode": "read", "server": "echo", "target": "echo://x"}}
            pid = (await _exchange(ws, launch, other))["result"]["process"]
            request = other.pop() if other else msgpack.unpackb(await ws.recv(), raw=False)
            assert request == {"type": "mcp_request", "call": request["call"], "process": pid, "server": "echo",
                               "method": "resources/read", "params": {"uri": "echo://x"}}
            call = request["call"]
            for bad, kind, words in [
                ({}, "invalid_input", "exactly one of 'result'"),
                ({"result": {}, "error": {"message": "x"}}, "invalid_input", "exactly one of 'result'"),
                ({"result": [1]}, "invalid_input", "must be a map"),
                ({"error": {"message": 3}}, "invalid_input", "string 'message'"),
                ({"error": {"message": "x", "code": "E1"}}, "invalid_input", "'code' must be an integer"),
                ({"call": call + 1000, "result": {}}, "not_found", f"no relayed MCP call {call + 1000}"),
            ]:
                reply = await _exchange(ws, {"type": "mcp_result", "id": 3, "call": call, **bad}, other)
                assert not reply["ok"] and reply["error"]["kind"] == kind and words in reply["error"]["message"]
            contents = {"contents": [{"uri": "echo://x", "text": "still waiting"}]}
            assert (await _exchange(ws, {"type": "mcp_result", "id": 4, "call": call, "result": contents}, other))["ok"]
            while not other:
                other.append(msgpack.unpackb(await ws.recv(), raw=False))
            assert (other[0]["type"], other[0]["event"], other[0]["value"]) == ("event", "return", "still waiting")
            reply = await _exchange(ws, {"type": "mcp_result", "id": 5, "call": call, "result": contents}, other)
            assert reply["error"]["kind"] == "not_found"

    served(scenario)


@pytest.mark.parametrize("frame, words", [
    ({"servers": "notes"}, "non-empty list of server names"),
    ({"servers": []}, "non-empty list of server names"),
    ({"servers": ["../etc"]}, "got '../etc'"),
    ({"servers": ["x" * 65]}, "1-64 characters"),
    ({"servers": ["ok"], "timeout": 0}, "'timeout' must be seconds in (0, 3600]"),
    ({"servers": ["ok"], "timeout": True}, "'timeout' must be seconds"),
    ({"servers": ["ok"], "timeout": 7200}, "got 7200"),
    ({"servers": [f"s{i}" for i in range(65)]}, "at most 64 MCP servers"),
])
def test_bad_registrations_are_refused_and_register_nothing(served, frame, words):
    async def scenario(s):
        async with raw_connect(s.url, s.tokens["alice"]) as ws:
            reply = await raw_request(ws, {"type": "mcp_register", "id": 1, **frame})
            assert reply["error"]["kind"] == "invalid_input" and words in reply["error"]["message"]
            reply = await raw_request(ws, {"type": "mcp_unregister", "id": 2, "servers": ["ok"]})
            assert "registered: none" in reply["error"]["message"]

    served(scenario)


def test_registering_needs_authentication(served):
    async def scenario(s):
        async with raw_connect(s.url) as ws:
            reply = await raw_request(ws, {"type": "mcp_register", "id": 1, "servers": ["notes"]})
            assert reply["error"]["kind"] == "unauthorized"

    served(scenario)


def test_the_sync_client_registers_a_plain_function(served):
    def answer(method, params):  # runs in a worker thread of the client
        if method == "tools/list":
            return {"tools": [{"name": "twice", "inputSchema": {"type": "object"}}]}
        return {"content": [{"type": "text", "text": f"{params['name']} {params['arguments']['n'] * 2}"}]}

    def sync_scenario(url, token):
        with connect_sync(url, token) as client:
            program = client.install(MCP_PROBE)
            assert client.register_mcp_server("double", answer) == ["double"]
            proc = client.launch(program, {"mode": "call", "server": "double", "target": "twice", "args": '{"n": 21}'})
            result = proc.wait()
            assert client.unregister_mcp_server("double") == []
            return result

    async def scenario(s):
        return await asyncio.to_thread(sync_scenario, s.url, s.tokens["alice"])

    assert served(scenario) == {"tools": ["twice"], "text": "twice 42"}


def test_relayed_servers_work_for_process_isolated_inferlets(dummy_engine):
    async def main():
        users = [User(name, hash_token(tok)) for name, tok in TOKENS.items()]
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
        launcher = ProcessLauncher(WorkerLimits(wall_s=30.0, cpu_s=30, memory_mb=512))
        server = PieServer(dummy_engine, opts, auth=Authenticator(users), launcher=launcher, close_engine=False)
        await server.start()
        try:
            s = Served(server, server.url, "", TOKENS)
            async with await connect(s.url, s.tokens["alice"]) as alice:
                program = await alice.install(MCP_PROBE)
                await alice.register_mcp_server("notes", notes_server())
                return await asyncio.wait_for(_run(alice, program, mode="call", target="shout", args={"text": "far"}), 60)
        finally:
            await server.close()

    assert asyncio.run(main()) == {"tools": ["shout", "boom"], "text": "FAR"}
    assert dummy_engine.pools_whole()
