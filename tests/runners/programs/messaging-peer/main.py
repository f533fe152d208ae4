"""The messaging program's peer: answers a queued question, broadcasts news, waits for the
parent's goodbye, broadcasts once more and returns. Alone, it pushes and pulls its own queue and
hears its own broadcast. In mode ``fail`` it raises, for the parent to see how a child's
failure reaches it."""

from inferlet import messaging, runtime


async def main(input):
    if input["mode"] == "fail":
        raise LookupError("the peer could not find its notes")
    if input["mode"] == "alone":
        with messaging.subscribe("runners-self") as sub:
            messaging.push("runners-self-queue", "one")
            messaging.push("runners-self-queue", "two")
            messaging.broadcast("runners-self", "heard")
            pulled = [await messaging.pull("runners-self-queue"), await messaging.pull("runners-self-queue")]
            return {"pulled": pulled, "heard": await sub.next(), "user": runtime.username()}
    question = await messaging.pull("runners-to-peer")
    messaging.push("runners-to-parent", f"{question} -> a dessert")
    for n in range(3):
        messaging.broadcast("runners-news", f"news {n}")
    goodbye = await messaging.pull("runners-to-peer")
    messaging.broadcast("runners-news", "last")
    return {"question": question, "goodbye": goodbye, "user": runtime.username()}
