"""Two inferlets talking: this one subscribes, spawns messaging-peer with runtime.spawn, pushes
it a question and pulls its answer, receives its broadcasts (``await sub.next()``, ``async for``,
``sub.get()``), and unsubscribes; the spawned child's result comes back from spawn, and a child
that fails (or is launched with bad input, or does not exist) raises in the parent."""

import asyncio

from inferlet import messaging, runtime
from inferlet.messaging import Subscription


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def main(input):
    out = {}
    sub = messaging.subscribe("runners-news")
    check(isinstance(sub, Subscription), "subscribe gives a Subscription")
    check(sub.get() is None, "nothing has been broadcast yet")
    child = asyncio.ensure_future(runtime.spawn(input["peer"], {"mode": "peer"}))
    messaging.push("runners-to-peer", "what is pie?")
    out["answer"] = await messaging.pull("runners-to-parent")
    news = [await sub.next()]
    async for msg in sub:
        news.append(msg)
        if len(news) == 3:
            break
    out["news"] = news
    messaging.push("runners-to-peer", "bye")
    out["child"] = await child
    polled = None
    for _ in range(1000):  # the peer's last broadcast, without waiting
        polled = sub.get()
        if polled is not None:
            break
        await asyncio.sleep(0.005)
    out["polled"] = polled
    sub.unsubscribe()
    out["after_unsubscribe"] = await sub.next()
    with messaging.subscribe("runners-quiet") as quiet:
        pass
    out["closed_by_with"] = [m async for m in quiet]
    for child_args in ({"mode": "fail"}, {"mode": "no-such-mode-is-fine-here", "extra": 1}):
        try:
            await runtime.spawn(input["peer"], child_args)
            out.setdefault("failed_children", []).append(None)
        except Exception as exc:  # noqa: BLE001
            out.setdefault("failed_children", []).append([type(exc).__name__, str(exc)])
    try:
        await runtime.spawn("runners-no-such-program@1.0.0", {})
    except Exception as exc:  # noqa: BLE001
        out["unknown_program"] = [type(exc).__name__, str(exc)]
    for bad in (lambda: messaging.push("", "x"), lambda: messaging.broadcast("", "x")):
        try:
            bad()
            out.setdefault("refused", []).append(None)
        except Exception as exc:  # noqa: BLE001
            out.setdefault("refused", []).append([type(exc).__name__, str(exc)])
    return out
