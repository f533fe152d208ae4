"""Servers a client registers reach its inferlets through the McpRelay seam (faked in-process)."""

import json

import pytest

from inferlet import mcp
from pie_core.errors import NotFound
from pie_core.host.binding import HostInstance

from fake_relay import BrokenRelay, InProcessRelay, notes_server
from mcp_harness import run


def _instance(engine, relay=None):
    inst = HostInstance(engine=engine, emit=lambda event: None)
    if relay is not None:
        engine.mcp.attach_relay(inst.id, relay)
    return inst


def test_relayed_servers_are_listed_only_for_the_instance_of_their_client(engine):
    async def main(_):
        return mcp.available_servers()

    with_relay = _instance(engine, InProcessRelay({"notes": notes_server()}))
    without = _instance(engine)
    results = run(engine, main, main, instances=[with_relay, without])
    assert [final.value for final, _ in results] == [["calc", "notes"], ["calc"]]


def test_session_calls_on_a_relayed_server_reach_the_clients_server(engine):
    relay = InProcessRelay({"notes": notes_server()})

    async def main(_):
        async with mcp.connect("notes") as notes:
            tools = json.loads(await notes.list_tools())["tools"]
            shout = json.loads(await notes.call_tool("shout", {"text": "hi"}))
            note = json.loads(await notes.read_resource("notes://today"))
        return [t["name"] for t in tools], shout["content"][0]["text"], note["contents"][0]["text"]

    ((final, _),) = run(engine, main, instances=[_instance(engine, relay)])
    assert final.value == (["shout"], "HI", "buy milk")
    assert relay.requests == [("notes", "tools/list"), ("notes", "tools/call"), ("notes", "resources/read")]
    assert engine.mcp.live_servers() == []  # nothing was started on the engine's side


def test_a_relayed_server_shadows_a_configured_one_of_the_same_name(engine):
    async def main(_):
        return [t["name"] for t in json.loads(await mcp.connect("calc").list_tools())["tools"]]

    ((final, _),) = run(engine, main, instances=[_instance(engine, InProcessRelay({"calc": notes_server()}))])
    assert final.value == ["shout"]


def test_relayed_failures_are_mcp_errors_naming_the_server(engine):
    async def main(_):
        messages = []
        for server, tool in (("notes", "nosuch"), ("gone", "anything")):
            try:
                await mcp.connect(server).call_tool(tool, {})
            except mcp.McpError as exc:
                messages.append(str(exc))
        return messages

    class Both(InProcessRelay):
        def servers(self):
            return ["notes", "gone"]

        async def request(self, server, method, params):
            if server == "gone":
                return await BrokenRelay().request(server, method, params)
            return await super().request(server, method, params)

    ((final, _),) = run(engine, main, instances=[_instance(engine, Both({"notes": notes_server()}))])
    unknown_tool, gone = final.value
    assert unknown_tool.startswith("tool 'nosuch' on MCP server 'notes' failed")
    assert "'gone' (registered by the client) failed during tools/call" in gone
    assert "ConnectionResetError: client disconnected" in gone


def test_a_detached_relays_servers_are_gone(engine):
    inst = _instance(engine, InProcessRelay({"notes": notes_server()}))
    engine.mcp.detach_relay(inst.id)

    async def main(_):
        with pytest.raises(NotFound, match="available: calc"):
            mcp.connect("notes")
        return "ok"

    assert run(engine, main, instances=[inst])[0][0].value == "ok"


def test_attaching_something_that_is_not_a_relay_is_refused(engine):
    with pytest.raises(TypeError, match="servers\\(\\) and async request\\(\\)"):
        engine.mcp.attach_relay("x", object())
