"""Interactive chat: read user messages with ``session.receive()``, stream each reply back with
``session.send()``, until the client sends ``/quit`` or ``max_turns`` is reached.

One context holds the conversation: each reply's tokens stay in it, ``ctx.seal()`` closes the
assistant turn, and the next ``ctx.user(...)`` builds on the cached KV — earlier turns are never
recomputed.
"""

from inferlet import Context, Model, Sampler, chat, runtime, session


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    t = input["temperature"]
    sampler = Sampler.argmax() if t <= 0 else Sampler.top_p(t, 0.95)
    replies = []

    with Context(model) as ctx:
        if input.get("system"):
            ctx.system(input["system"])
        for _ in range(input["max_turns"]):
            msg = await session.receive()
            if msg.strip() == "/quit":
                break
            ctx.user(msg)
            dec, reply = chat.Decoder(model), []
            async for step in ctx.generate(sampler, max_tokens=input["max_tokens"]):
                out = await step.execute()
                match dec.feed(out.tokens):
                    case chat.Event.Delta(text=text):
                        session.send(text)
                        reply.append(text)
                    case _:
                        pass
            replies.append("".join(reply))
            session.send("\n")
            ctx.seal()  # close the assistant turn; the conversation goes on

    return {"turns": len(replies), "replies": replies}
