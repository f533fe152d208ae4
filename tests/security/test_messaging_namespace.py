"""Class 2 (messaging) and class 5 (bounds): a topic or queue name resolves inside its user's
namespace, so mallory can neither read alice's queues nor publish into her topics, and every
queue, inbox and name count is bounded with a clear error at the sender."""

from __future__ import annotations

import asyncio
from typing import Any

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.server.quotas import Quotas

MESSENGER = """
import asyncio
from inferlet import messaging, session

async def main(input):
    op, name = input["op"], input["name"]
    if op == "push":
        messaging.push(name, input["text"])
        return "pushed"
    if op == "pull":
        try:
            return await asyncio.wait_for(messaging.pull(name), input["wait"])
        except asyncio.TimeoutError:
            return None
    if op == "broadcast":
        messaging.broadcast(name, input["text"])
        return "sent"
    if op == "listen":
        with messaging.subscribe(name) as sub:
            session.send("listening")
            got = []
            try:
                while True:
                    got.append(await asyncio.wait_for(sub.next(), input["wait"]))
            except asyncio.TimeoutError:
                return got
    raise ValueError(op)
"""

PARAMS = ('op = { type = "string" }\nname = { type = "string" }\ntext = { type = "string", optional = true }\n'
          'wait = { type = "float", optional = true }')

BOUNDS = """
from inferlet import messaging

async def main(input):
    out = {}
    try:
        messaging.push("big", "b" * 5000)
    except Exception as exc:
        out["big"] = f"{type(exc).__name__}: {exc}"
    try:
        for i in range(1000):
            messaging.push("full", "m")
    except Exception as exc:
        out["full"] = (i, f"{type(exc).__name__}: {exc}")
    subs = []
    try:
        for i in range(1000):
            subs.append(messaging.subscribe(f"t{i}"))
    except Exception as exc:
        out["topics"] = (i, f"{type(exc).__name__}: {exc}")
    for sub in subs:
        sub.unsubscribe()
    for i in range(2000):  # a drained queue is forgotten, so fresh names cost nothing
        messaging.push(f"q{i}", "x")
        await messaging.pull(f"q{i}")
    while True:  # drain "full" too
        try:
            import asyncio
            await asyncio.wait_for(messaging.pull("full"), 0.05)
        except asyncio.TimeoutError:
            break
    return out
"""


async def _program(client: Any, folder: Any) -> str:
    return await client.install(write_program(folder, MESSENGER, name="messenger", parameters=PARAMS))


def test_mallory_cannot_pull_from_alices_queue(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["alice"]) as alice, await connect(s.url, s.tokens["mallory"]) as mallory:
            a_prog, m_prog = await _program(alice, tmp_path / "a"), await _program(mallory, tmp_path / "m")
            assert await (await alice.launch(a_prog, {"op": "push", "name": "jobs", "text": "alice's secret"})).wait() == "pushed"
            stolen = await (await mallory.launch(m_prog, {"op": "pull", "name": "jobs", "wait": 1.0})).wait()
            assert stolen is None
            mine = await (await alice.launch(a_prog, {"op": "pull", "name": "jobs", "wait": 5.0})).wait()
            assert mine == "alice's secret"
        assert s.server.engine.broker.queue_count() == 0

    hostile(scenario)


def test_mallory_cannot_publish_into_alices_topic(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["alice"]) as alice, await connect(s.url, s.tokens["mallory"]) as mallory:
            a_prog, m_prog = await _program(alice, tmp_path / "a"), await _program(mallory, tmp_path / "m")
            listener = await alice.launch(a_prog, {"op": "listen", "name": "news", "wait": 3.0})
            async for ev in listener.events():
                if ev.kind == "stdout":
                    break
            assert await (await mallory.launch(m_prog, {"op": "broadcast", "name": "news", "text": "fake"})).wait() == "sent"
            assert await (await alice.launch(a_prog, {"op": "broadcast", "name": "news", "text": "real"})).wait() == "sent"
            assert await asyncio.wait_for(listener.wait(), 20) == ["real"]
        await victim_is_served(s)

    hostile(scenario)


def test_messages_queues_and_names_are_bounded_with_clear_errors(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            prog = await mallory.install(write_program(tmp_path / "b", BOUNDS, name="bounds"))
            out = await asyncio.wait_for((await mallory.launch(prog)).wait(), 30)
        assert "at most 4096 bytes (quota server.quotas.message_bytes), got 5000" in out["big"]
        assert out["full"][0] == 100 and "quota server.quotas.queue_messages" in out["full"][1]
        # "full" is one queue in use, so 7 more subscriptions fit under 8.
        assert out["topics"][0] == 7 and "8 of its 8 subscriptions and non-empty queues" in out["topics"][1]
        broker = s.server.engine.broker
        assert broker.queue_count() == 0 and broker.in_use("mallory") == 0 and broker.subscriber_count() == 0
        await victim_is_served(s)

    hostile(scenario, quotas=Quotas(message_bytes=4096, queue_messages=100, topics=8))
