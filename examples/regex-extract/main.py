"""Regex-constrained answers: whatever the model would say, the reply matches the pattern.

The pattern becomes a grammar (``Regex``); each step masks the tokens that would leave it, and
the end-of-turn token is allowed only where the pattern can end, so the reply is exactly one
match.
"""

from inferlet import Context, Model, Regex, Sampler, runtime


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user(f"{input['question']} Answer with just the answer.")
        g = ctx.generate(Sampler.argmax(), max_tokens=input["max_tokens"], constrain=Regex(input["pattern"]))
        answer = await g.collect_text()
        return {"answer": answer, "pattern": input["pattern"], "tokens": g.tokens_generated}
