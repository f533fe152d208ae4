"""main lets an engine error escape after sending output and holding pages: the run ends with
an Error event ``InvalidInput: ...`` (the host error's class and message), and the pages return."""

from inferlet import Context, Model, Sampler, runtime, session


async def main(input):
    model = Model.load(runtime.models()[0])
    ctx = Context(model)
    ctx.user("Hold a few pages.")
    tokens = await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
    session.send(f"generated {tokens}")
    fwd = ctx.forward()
    fwd.input([model.vocab_size])
    await fwd.execute()
    return "unreachable"
