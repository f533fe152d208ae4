"""Calls the engine refuses, each caught as the inferlet sees it (class name and message): token
ids and positions past their range (negative ones are wire-values cases), mismatched masks and
rows, an unknown model, released handles, a truncation past the working pages, bad snapshot and
adapter names, a NaN bid. The context refused in a pass keeps working afterwards."""

from inferlet import Adapter, Context, Model, Sampler, runtime
from inferlet.host.errors import PieError


async def attempt(fn):
    try:
        value = fn()
        if hasattr(value, "__await__"):
            await value
    except Exception as exc:  # noqa: BLE001 - the class and text are the observation
        return [type(exc).__name__, str(exc), isinstance(exc, PieError)]
    return None


def pass_on(ctx, tokens, positions=None, masks=None, logit_mask=None, sample=None):
    fwd = ctx.forward()
    if positions is None:
        fwd.input(tokens)
    else:
        fwd.input_at(tokens, positions)
    if masks is not None:
        fwd.attention_mask(masks)
    if logit_mask is not None:
        fwd.mask(logit_mask)
    fwd.sample([len(tokens) - 1 if sample is None else sample], Sampler.argmax())
    return fwd.execute()


async def main(input):
    model = Model.load(runtime.models()[0])
    vocab = model.vocab_size
    out = {}
    with Context(model) as ctx:
        ctx.append([1, 2, 3])
        await ctx.flush()
        cases = {
            "token_too_big": lambda: pass_on(ctx, [5, vocab + 7]),
            "position_too_big": lambda: pass_on(ctx, [5, 6], positions=[3, 10**9]),
            "positions_repeat": lambda: pass_on(ctx, [5, 6], positions=[4, 4]),
            "mask_rows": lambda: pass_on(ctx, [5, 6], masks=[[0, 5]]),
            "mask_length": lambda: pass_on(ctx, [5], masks=[[0, 2]]),
            "logit_mask_length": lambda: pass_on(ctx, [5], logit_mask=[0, 10]),
            "sample_row": lambda: pass_on(ctx, [5], sample=3),
            "empty_pass": lambda: ctx.forward().execute(),
            "truncate": lambda: ctx.truncate(50),
            "unknown_model": lambda: Model.load("no-such-model"),
            "context_of_unknown_model": lambda: Context(Model("no-such-model")),
            "adapter_name": lambda: Adapter.create(model, "x" * 300),
            "snapshot_name": lambda: ctx.save(""),
            "bid": lambda: ctx.set_bid(float("nan")),
            "generate_max_tokens": lambda: ctx.generate(Sampler.argmax(), max_tokens=-1),
        }
        for name, fn in cases.items():
            out[name] = await attempt(fn)
        out["still_works"] = [ctx.seq_len, await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()]
    released = Context(model)
    released.release()
    out["released"] = await attempt(lambda: released.forward())
    return out
