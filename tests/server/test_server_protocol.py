"""End to end over a loopback socket: upload, launch, stream, messages, files, signals."""

from __future__ import annotations

import asyncio

from conftest import PROBE
from server_helpers import wait_until

from pie_core.client import connect, connect_sync, pack_program


def test_upload_launch_and_stream_generation(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            program = await client.install(PROBE)
            assert program == "probe@1.0.0"
            proc = await client.launch(program, {"mode": "generate", "max_tokens": 5})
            events = [ev async for ev in proc.events()]
            assert [e.kind for e in events] == ["stdout"] * 5 + ["return"]
            assert [e.value for e in events[:5]] == [f"step {i}" for i in range(1, 6)]
            assert events[-1].value == 5
            assert [e.seq for e in events] == list(range(1, 7))
        await wait_until(lambda: len(s.server.processes) == 0)

    served(scenario)


def test_same_archive_is_stored_once_and_reuploads_skip_the_bytes(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            await client.install(PROBE)
            stored = list((s.server.store.root).glob("*/Pie.toml"))
            data = pack_program(PROBE)
            import hashlib

            begin = await client.request("upload_begin", size=len(data), sha256=hashlib.sha256(data).hexdigest())
            assert begin["stored"] is True and begin["name"] == "probe"
        async with await connect(s.url, s.tokens["bob"]) as other:
            assert await other.install(PROBE) == "probe@1.0.0"
        assert list(s.server.store.root.glob("*/Pie.toml")) == stored and len(stored) == 1

    served(scenario)


def test_messages_flow_both_ways_and_a_signal_arrives_through_receive(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            proc = await client.launch(await client.install(PROBE), {"mode": "echo"})
            await proc.send("one")
            await proc.send("two")
            await proc.signal("stop")
            events = [ev async for ev in proc.events()]
            assert [(e.kind, e.value) for e in events] == [("stdout", "echo:one"), ("stdout", "echo:two"), ("return", "stopped")]

    served(scenario)


def test_files_flow_both_ways(served):
    async def scenario(s):
        blob = bytes(range(256)) * 1000
        async with await connect(s.url, s.tokens["alice"]) as client:
            proc = await client.launch(await client.install(PROBE), {"mode": "file"})
            await proc.transfer_file(blob)
            events = [ev async for ev in proc.events()]
            assert events[0].kind == "file" and events[0].value == blob[::-1]
            assert (events[1].kind, events[1].value) == ("return", len(blob))

    served(scenario)


def test_stderr_becomes_a_stderr_event(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            proc = await client.launch(await client.install(PROBE), {"mode": "stderr"})
            events = [(ev.kind, ev.value) async for ev in proc.events()]
            assert ("stderr", "to stderr") in events and events[-1] == ("return", "ok")

    served(scenario)


def test_terminate_ends_a_process_with_an_error_event_and_frees_its_pages(served, dummy_engine):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            proc = await client.launch(await client.install(PROBE), {"mode": "hold"})
            first = await proc.events().__anext__()
            assert first.value == "holding"
            assert not dummy_engine.pools_whole()
            await proc.terminate()
            rest = [ev async for ev in proc.events()]
            assert rest[-1].kind == "error" and "terminated by client" in rest[-1].value
        await wait_until(lambda: len(s.server.processes) == 0)
        assert dummy_engine.pools_whole()

    served(scenario)


def test_detach_buffers_events_and_reattach_replays_them_all_in_order(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            proc = await client.launch(await client.install(PROBE), {"mode": "echo"})
            await proc.send("before")
            first = await proc.events().__anext__()
            assert first.value == "echo:before"
            await proc.detach()
            for i in range(20):
                await proc.send(f"m{i}")
            pid = proc.id
            sproc = s.server.processes.get("alice", pid)
            await wait_until(lambda: len(sproc.pending) == 20)
        # the connection closed: a detached process lives on and keeps its events
        async with await connect(s.url, s.tokens["alice"]) as again:
            listed = await again.list_processes()
            assert [(p["process"], p["state"], p["buffered"]) for p in listed] == [(pid, "detached", 20)]
            proc2 = await again.attach(pid)
            await proc2.signal("stop")
            events = [ev async for ev in proc2.events()]
            assert [e.value for e in events[:20]] == [f"echo:m{i}" for i in range(20)]
            assert [e.seq for e in events] == list(range(2, 23))
            assert events[-1].value == "stopped"
        await wait_until(lambda: len(s.server.processes) == 0)

    served(scenario)


def test_ping_and_listings(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            assert (await client.request("ping", data=b"echo me"))["data"] == b"echo me"
            rtt = await client.ping()
            assert isinstance(rtt, float)
            models = await client.list_models()
            assert models[0]["backend"] == "dummy"
            programs = await client.list_programs()
            assert "openai-compat@0.1.0" in programs and "hello-world@0.1.0" in programs
            assert await client.list_processes() == []
            result = await (await client.launch("hello-world", {"name": "pie"})).wait()
            assert result == "hello pie"

    served(scenario)


def test_sync_client_runs_a_program(served):
    async def scenario(s):
        def blocking() -> tuple[str, list[str]]:
            with connect_sync(s.url, s.tokens["alice"]) as client:
                proc = client.launch(client.install(PROBE), {"mode": "echo"})
                proc.send("x")
                proc.signal("stop")
                kinds = [ev.value for ev in proc.events()]
                return client.list_models()[0]["backend"], kinds

        backend, values = await asyncio.to_thread(blocking)
        assert backend == "dummy" and values == ["echo:x", "stopped"]

    served(scenario)
