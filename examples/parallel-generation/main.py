"""Parallel generation: prefill the prompt once, fork it N times, decode the forks together.

The forks share the prompt's committed KV pages (copy-on-write), and ``asyncio.gather`` lets the
engine batch their decode steps.
"""

import asyncio

from inferlet import Context, Model, Sampler, runtime


async def complete(ctx: Context, sampler: Sampler, max_tokens: int) -> str:
    with ctx:  # the fork's pages go back to the pool when it is done
        return await ctx.generate(sampler, max_tokens=max_tokens).collect_text()


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    with Context(model) as prefix:
        prefix.user(input["prompt"])
        await prefix.flush()  # computed once, shared by every fork

        seed = input["seed"]
        texts = await asyncio.gather(
            *(
                complete(
                    prefix.fork(),
                    Sampler.top_p(input["temperature"], 0.95, seed=seed + i if seed else 0),
                    input["max_tokens"],
                )
                for i in range(input["n"])
            )
        )
    return {"texts": list(texts)}
