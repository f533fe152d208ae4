"""One host call whose argument lies outside what the call declares: a negative token id,
position, count or index, an int where a string goes, a bool where a number goes. The engine
refuses each with an error the inferlet can catch (its class and message are the result);
``input["case"]`` picks the call, so a runner that cannot deliver the refusal fails that case
alone."""

from inferlet import Adapter, Context, Grammar, Matcher, Model, Sampler, messaging, runtime, session


def forward(ctx, tokens, positions=None, sample=0):
    fwd = ctx.forward()
    if positions is None:
        fwd.input(tokens)
    else:
        fwd.input_at(tokens, positions)
    fwd.sample([sample], Sampler.argmax())
    return fwd.execute()


CASES = {
    "negative_token": lambda m, ctx: forward(ctx, [-1]),
    "huge_token": lambda m, ctx: forward(ctx, [2**40]),
    "negative_position": lambda m, ctx: forward(ctx, [5], positions=[-2]),
    "negative_sample_index": lambda m, ctx: forward(ctx, [5], sample=-1),
    "negative_truncate": lambda m, ctx: ctx.truncate(-1),
    "negative_reserve": lambda m, ctx: ctx.inner().reserve_working_pages(-1),
    "negative_rollback": lambda m, ctx: Matcher(Grammar.from_regex("a+"), m).rollback(-1),
    "int_message": lambda m, ctx: messaging.broadcast("runners-wire", 5),
    "int_adapter_name": lambda m, ctx: Adapter.create(m, 5),
    "bool_bid": lambda m, ctx: ctx.set_bid(True),
    "int_compile_timeout": lambda m, ctx: Matcher(Grammar.from_regex("a+"), m, compile_timeout=0),
    "str_file": lambda m, ctx: session.send_file("not bytes"),
    "int_scratch_path": lambda m, ctx: runtime.scratch_path(5),
}


async def main(input):
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.append([1, 2, 3])
        await ctx.flush()
        try:
            value = CASES[input["case"]](model, ctx)
            if hasattr(value, "__await__"):
                await value
        except Exception as exc:  # noqa: BLE001 - the class and text are the observation
            return [type(exc).__name__, str(exc)]
        return "accepted"
