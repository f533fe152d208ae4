"""A common shape of inferlet code: a helper makes a Context, a host call in it fails, the caller
catches the error. The error's traceback and the helper's frame form a reference cycle holding
the Context, so the garbage collector, not the helper's return, finalises it, on whichever of
the inferlet's threads it runs then; ``Context.__del__`` releases it there ("KV pages release
on drop"). Many rounds of it must neither hang nor leak pages."""

import gc

from inferlet import Context, Model, runtime
from inferlet.host.errors import InvalidInput

ROUNDS = 300


def fail_holding_a_context(model):
    ctx = Context(model)  # the last reference: a local of the frame the engine's error passes through
    ctx.append([1, 2, 3])
    ctx.truncate(5)


async def main(input):
    model = Model.load(runtime.models()[0])
    refused = set()
    for _ in range(ROUNDS):
        try:
            fail_holding_a_context(model)
        except InvalidInput as exc:
            refused.add(str(exc))
    gc.collect()
    with Context(model) as ctx:
        ctx.append([4, 5])
        await ctx.flush()
        length = ctx.seq_len
    return {"rounds": ROUNDS, "refused": sorted(refused), "afterwards": length}
