import asyncio

import pytest

from inferlet import messaging
from pie_core.errors import InvalidInput


def test_broadcast_reaches_every_subscriber_and_queue_is_fifo(dummy):
    async def listener(_):
        with messaging.subscribe("news") as sub:
            messaging.push("ready", "1")
            got = [await sub.next(), await sub.next()]
        return got

    async def speaker(_):
        await messaging.pull("ready")
        await messaging.pull("ready")
        messaging.broadcast("news", "a")
        messaging.broadcast("news", "b")
        return "sent"

    async def go():
        results = await asyncio.gather(
            dummy.run_async(listener), dummy.run_async(listener), dummy.run_async(speaker)
        )
        return [final.value for final, _ in results]

    assert asyncio.run(go()) == [["a", "b"], ["a", "b"], "sent"]
    assert dummy.engine.broker.subscriber_count() == 0


def test_async_iteration_ends_after_unsubscribe(dummy):
    async def main(_):
        sub = messaging.subscribe("t")
        messaging.broadcast("t", "x")
        seen = []
        async for msg in sub:
            seen.append(msg)
            sub.unsubscribe()
        messaging.broadcast("t", "after")
        return seen, await sub.next()

    assert dummy.value(main) == (["x"], None)


def test_subscriptions_close_when_the_inferlet_ends(dummy):
    async def main(_):
        messaging.subscribe("left-open")
        raise RuntimeError("exit without unsubscribing")

    final, _ = dummy.run(main)
    assert final.kind == "error"
    assert dummy.engine.broker.subscriber_count() == 0


def test_bad_topic_is_refused(dummy):
    async def main(_):
        with pytest.raises(InvalidInput, match="non-empty string"):
            messaging.broadcast("", "x")
        with pytest.raises(InvalidInput, match=r"messaging.push\(\): message must be a str, got int"):
            messaging.push("q", 3)
        return "ok"

    assert dummy.value(main) == "ok"
