"""Class 5: one user cannot starve the others. Each test lets mallory take as much of one
resource as she can and checks that she is stopped at her quota with a clear error while alice
keeps being served."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from hostile import PROBE, TOKENS, Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.client.client import ServerError
from pie_core.errors import InvalidInput
from pie_core.runtime.launcher import InProcessLauncher
from pie_core.server import app as app_module
from pie_core.server.auth import User, hash_token, metrics_id
from pie_core.server.quotas import Quotas

HOG_SNAPSHOTS = """
from inferlet import Context, Model, runtime

async def main(input):
    ctx = Context(Model.load(runtime.models()[0]))
    ctx.append([7] * (ctx.page_size * 10))
    await ctx.flush()
    saved = []
    try:
        for i in range(100_000):
            ctx.save(f"hog-{i}")
            saved.append(f"hog-{i}")
    except Exception as exc:
        return {"saved": saved, "error": f"{type(exc).__name__}: {exc}"}
    return {"saved": saved, "error": None}
"""

HOG_CONTEXTS = """
from inferlet import Context, Model, runtime

async def main(input):
    model = Model.load(runtime.models()[0])
    held = []
    try:
        while True:
            ctx = Context(model)
            ctx.inner().reserve_working_pages(16)
            held.append(ctx)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
"""

DROP_SNAPSHOTS = """
from inferlet import Context, Model, runtime

async def main(input):
    model = Model.load(runtime.models()[0])
    names = input["names"].split(",")
    for name in names:
        Context.delete(model, name)
    return len(names)
"""

FLOOD_EVENTS = """
import asyncio
from inferlet import session

async def main(input):
    chunk = "x" * 65536
    while True:
        session.send(chunk)
        await asyncio.sleep(0)
"""

SLEEPER = """
import asyncio

async def main(input):
    await asyncio.sleep(60)
"""

FILL_SCRATCH = """
from inferlet import runtime

async def main(input):
    with open(runtime.scratch_path("big.bin"), "wb") as f:
        f.write(b"z" * input["size"])
    return "written"
"""


async def _metrics(s: Served) -> str:
    def get() -> str:
        request = urllib.request.Request(s.http + "/metrics", headers={"Authorization": f"Bearer {s.tokens['alice']}"})
        with urllib.request.urlopen(request) as resp:
            return resp.read().decode()

    return await asyncio.to_thread(get)


def _gauge(text: str, name: str, user: str) -> float:
    """A user's gauge, found under the pseudonym /metrics gives it (its name never appears)."""
    assert f'user="{user}"' not in text
    label = metrics_id(User(user, hash_token(TOKENS[user])))
    total = 0.0
    for m in re.finditer(rf'^{name}\{{user="{label}"[^}}]*\}} (\S+)$', text, re.M):
        total += float(m[1])
    return total


async def _install(client: Any, folder: Any, main_py: str, **kw: Any) -> str:
    return await client.install(write_program(folder, main_py, **kw))


def test_snapshots_stop_at_the_users_page_quota_and_alice_still_generates(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            result = await (await mallory.launch(await _install(mallory, tmp_path / "hog", HOG_SNAPSHOTS))).wait()
            assert result["error"] is not None and "OutOfPages" in result["error"]
            assert "user mallory holds" in result["error"] and "quota server.quotas.pages" in result["error"]
            assert result["saved"], "the first snapshots fit in the quota"
            # The process ended; its snapshots still count against mallory (and only her).
            text = await _metrics(s)
            held = _gauge(text, "pie_user_kv_pages", "mallory")
            assert 0 < held <= 64
            assert _gauge(text, "pie_user_snapshots", "mallory") == len(result["saved"])
            async with await connect(s.url, s.tokens["alice"]) as alice:
                gen = await alice.launch(await alice.install(PROBE), {"mode": "generate", "max_tokens": 4})
                assert await asyncio.wait_for(gen.wait(), 20) == 4
            drop = await _install(mallory, tmp_path / "drop", DROP_SNAPSHOTS,
                                  name="drop", parameters='names = { type = "string" }')
            assert await (await mallory.launch(drop, {"names": ",".join(result["saved"])})).wait() == len(result["saved"])
            assert _gauge(await _metrics(s), "pie_user_kv_pages", "mallory") == 0

    hostile(scenario, quotas=Quotas(pages=64))


def test_contexts_stop_at_the_page_quota_before_the_pool_runs_dry(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            error = await (await mallory.launch(await _install(mallory, tmp_path / "hog", HOG_CONTEXTS))).wait()
        assert error.startswith("OutOfPages: user mallory holds 1024 of its 1024 KV pages")
        assert "release contexts or snapshots" in error
        await victim_is_served(s)

    hostile(scenario, quotas=Quotas(pages=0.25))


def test_a_detached_flood_of_large_events_is_cancelled_at_the_byte_quota(hostile, tmp_path):
    limit = 2**20

    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            proc = await mallory.launch(await _install(mallory, tmp_path / "flood", FLOOD_EVENTS), detached=True)
            table = s.server.processes
            entry = table.get("mallory", proc.id)
            for _ in range(400):
                assert entry.pending_bytes <= limit  # memory stays bounded the whole time
                if entry.finished:
                    break
                await asyncio.sleep(0.025)
            assert entry.finished
            assert entry.pending_bytes <= limit
            final = entry.pending[-1]
            assert final[1] == "error" and "server.quotas.event_bytes" in final[2]
            await victim_is_served(s)
            attached = await mallory.attach(proc.id)
            with pytest.raises(Exception, match="event_bytes"):
                await asyncio.wait_for(attached.wait(), 20)

    hostile(scenario, quotas=Quotas(event_bytes=limit))


def test_flooding_a_process_inbox_is_refused_at_the_byte_quota(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            proc = await mallory.launch(await _install(mallory, tmp_path / "sleep", SLEEPER))
            big = "m" * 300_000
            sent = 0
            with pytest.raises(ServerError) as refused:
                for _ in range(100):
                    await proc.send(big)
                    sent += 1
            assert sent == 3  # 3 x 300 kB fit in 1 MiB, the 4th does not
            assert refused.value.kind == "invalid_input" and "server.quotas.inbox_bytes" in refused.value.message
            with pytest.raises(ServerError, match="inbox_bytes"):
                await proc.transfer_file(b"f" * 200_000)
            await victim_is_served(s)
            await proc.terminate()

    hostile(scenario, quotas=Quotas(inbox_bytes=2**20))


def test_processes_past_the_users_quota_are_refused(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            program = await _install(mallory, tmp_path / "sleep", SLEEPER)
            first = [await mallory.launch(program) for _ in range(2)]
            with pytest.raises(ServerError, match=r"runs 2 of its 2 processes \(quota server.quotas.processes\)"):
                await mallory.launch(program)
            await victim_is_served(s)
            for proc in first:
                await proc.terminate()

    hostile(scenario, quotas=Quotas(processes=2))


def test_connections_past_the_users_quota_are_refused_and_alice_still_connects(hostile):
    async def scenario(s: Served) -> None:
        held = [await connect(s.url, s.tokens["mallory"]) for _ in range(3)]
        await held[0].ping()
        with pytest.raises(ConnectionClosed) as refused:  # closed at once, the reason in the close frame
            await connect(s.url, s.tokens["mallory"])
        assert refused.value.rcvd is not None and refused.value.rcvd.code == 1008
        assert "user mallory has 3 of its 3 connections open (quota server.quotas.connections)" in refused.value.rcvd.reason
        # Authenticating by frame counts the same way.
        anon = await connect(s.url)
        with pytest.raises(ServerError, match="server.quotas.connections"):
            await anon.authenticate(s.tokens["mallory"])
        await victim_is_served(s)
        for c in [*held, anon]:
            await c.close()
        fresh = await connect(s.url, s.tokens["mallory"])  # closed ones no longer count
        await fresh.ping()
        await fresh.close()

    hostile(scenario, quotas=Quotas(connections=3))


def test_unauthenticated_connections_are_capped_and_users_still_connect(hostile):
    async def scenario(s: Served) -> None:
        idle = [await ws_connect(s.url) for _ in range(4)]
        extra = await ws_connect(s.url)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(extra.recv(), 5)
        assert "wait for authentication" in (extra.close_reason or "")
        await victim_is_served(s)
        for ws in idle:
            await ws.close()

    hostile(scenario, max_unauthenticated=4)


def test_a_full_scratch_directory_refuses_further_launches(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            program = await _install(mallory, tmp_path / "fill", FILL_SCRATCH, parameters='size = { type = "int" }')
            assert await (await mallory.launch(program, {"size": 512 * 1024})).wait() == "written"
            for _ in range(100):  # the size is measured in a thread once the process ends
                if s.server.processes.scratch.sizes().get("mallory", 0) > 256 * 1024:
                    break
                await asyncio.sleep(0.05)
            with pytest.raises(ServerError, match=r"scratch directory holds \d+ bytes, over its 262144-byte quota"):
                await mallory.launch(program, {"size": 1})
            assert _gauge(await _metrics(s), "pie_user_scratch_bytes", "mallory") > 256 * 1024
        await victim_is_served(s)

    hostile(scenario, quotas=Quotas(scratch_bytes=256 * 1024))


def test_metrics_show_what_each_user_holds(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            hold = await mallory.launch(await mallory.install(PROBE), {"mode": "hold"})
            async for ev in hold.events():
                if ev.kind == "stdout":
                    break
            text = await _metrics(s)
            assert _gauge(text, "pie_user_kv_pages", "mallory") > 0
            assert _gauge(text, "pie_user_processes", "mallory") == 1
            assert _gauge(text, "pie_user_connections", "mallory") == 1
            assert _gauge(text, "pie_user_kv_pages", "alice") == 0
            for name in ("pie_user_snapshots", "pie_user_event_bytes", "pie_user_scratch_bytes"):
                assert f"# TYPE {name} gauge" in text
            await hold.send("done")
            assert await hold.wait() == "done"

    hostile(scenario)


def test_quotas_from_config_read_sizes_shares_and_per_user_overrides(tmp_path):
    from pie_core import config

    doc = config.default_config()
    config.set("server.quotas.pages", 0.5, doc)
    config.set("server.quotas.event_bytes", "2MiB", doc)
    config.set("server.quotas.users.mallory.processes", 1, doc)
    quotas = Quotas.from_config(doc)
    assert quotas.pages_of(4096) == 2048 and quotas.event_bytes == 2 * 2**20
    # a share truncates (never more than the share of the pool), but is at least one page
    assert (quotas.pages_of(7), quotas.pages_of(5), quotas.pages_of(1)) == (3, 2, 1)
    assert quotas.for_user("mallory").processes == 1 and quotas.for_user("alice").processes == Quotas().processes
    config.set("server.quotas.inbox_bytes", "lots", doc)
    with pytest.raises(InvalidInput, match="server.quotas.inbox_bytes: not a size"):
        Quotas.from_config(doc)
    bad = config.default_config()
    config.set("server.quotas.pagez", 3, bad)
    with pytest.raises(InvalidInput, match="unknown quota server.quotas.pagez"):
        Quotas.from_config(bad)
    worse = config.default_config()
    config.set("server.quotas.users.mallory.pages", 1.5, worse)
    with pytest.raises(InvalidInput, match=r"must be in \(0, 1\].*server.quotas.users.mallory"):
        Quotas.from_config(worse)


def test_http_requests_in_flight_count_against_the_connection_quota(hostile):
    async def scenario(s: Served) -> None:
        held = [await connect(s.url, s.tokens["mallory"]) for _ in range(2)]

        def post() -> tuple[int, dict]:
            req = urllib.request.Request(s.http + "/v1/completions", method="POST",
                                         data=json.dumps({"prompt": "hi", "max_tokens": 1}).encode(),
                                         headers={"Authorization": f"Bearer {s.tokens['mallory']}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        status, body = await asyncio.to_thread(post)
        assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
        assert "server.quotas.connections" in body["error"]["message"]
        await held[0].close()
        status, body = await asyncio.to_thread(post)
        assert status == 200, body
        await held[1].close()
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher(), quotas=Quotas(connections=2))


def test_a_websocket_that_never_authenticates_is_closed_after_the_deadline(hostile, monkeypatch):
    monkeypatch.setattr(app_module, "AUTH_TIMEOUT_S", 0.5)

    async def scenario(s: Served) -> None:
        idle = await ws_connect(s.url)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(idle.recv(), 5)
        assert idle.close_code == 1008 and "authenticate within 0.5 s" in (idle.close_reason or "")
        async with await connect(s.url, s.tokens["alice"]) as alice:  # authenticated at once: never closed
            await asyncio.sleep(1.0)
            await alice.ping()

    hostile(scenario, launcher=InProcessLauncher())
