import sys

from inferlet import Context, Model, Sampler, runtime, session


async def main(input: dict):
    mode = input["mode"]
    if mode == "echo":  # every message comes back; "stop" ends it
        while True:
            msg = await session.receive()
            if msg == "stop":
                return "stopped"
            session.send(f"echo:{msg}")
    if mode == "file":  # the file comes back reversed
        data = await session.receive_file()
        session.send_file(data[::-1])
        return len(data)
    if mode == "generate":  # one Stdout event per decoded step
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user("count")
            n = 0
            async for step in ctx.generate(Sampler.argmax(), max_tokens=input["max_tokens"], stop=[]):
                await step.execute()
                n += 1
                session.send(f"step {n}")
            return n
    if mode == "hold":  # holds KV pages, then waits for a message forever
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user("hold these pages")
            await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
            session.send("holding")
            return await session.receive()
    if mode == "user":
        return runtime.username()
    if mode == "stderr":
        print("to stderr", file=sys.stderr)
        return "ok"
    raise ValueError(f"unknown mode {mode!r}")
