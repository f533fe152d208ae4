"""The Python twin of programs/options."""

from inferlet import Adapter, Context, Model, Sampler, runtime


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user("Count.")
        masked = await ctx.generate(Sampler.argmax(), max_tokens=6, stop=[], logit_mask=[1000, 50, model.vocab_size - 1050]).collect_tokens()
    with Context(model) as fork, Adapter.create(model, "py-options") as a:
        fork.user("Count.")
        adapted = await fork.generate(Sampler.argmax(), max_tokens=6, stop=[], adapter=a).collect_tokens()
    return {"masked": masked, "adapted": adapted}
