from inferlet import Context, Model, Sampler, chat, runtime, session


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    temperature = input["temperature"]
    sampler = (
        Sampler.argmax()
        if temperature <= 0
        else Sampler.top_p(temperature, input["top_p"], seed=input["seed"])
    )
    with Context(model) as ctx:
        if input.get("system"):
            ctx.system(input["system"])
        ctx.user(input.get("prompt") or "Write a haiku about paged attention.")
        g = ctx.generate(sampler, max_tokens=input["max_tokens"])
        dec = chat.Decoder(model)
        async for step in g:
            out = await step.execute()
            match dec.feed(out.tokens):
                case chat.Event.Delta(text=t):
                    session.send(t)
                case _:
                    pass
        return {"tokens": g.tokens_generated}
