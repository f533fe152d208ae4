"""The KV-page market as an inferlet reads and steers it: price, balance (new pages burn
credits), dividend, rent and latency; set_bid (and its refusals), nested ``with ctx.idle()``,
and ``ctx.suspend()`` whose context comes back with the same continuation."""

from inferlet import Context, Model, Sampler, runtime, scheduling


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def r(x):
    return float(f"{x:.6g}")


def refused(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]
    return None


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    price = scheduling.price()
    start = scheduling.balance(model)
    out["start"] = [r(price), r(start), r(scheduling.dividend(model))]
    with Context(model) as ctx:
        ctx.user("Spend some credits on pages: " + "word " * 40)
        await ctx.flush()
        spent = start - scheduling.balance(model)
        pages = ctx.inner().committed_page_count() + ctx.inner().working_page_count()
        check(spent > 0, "new pages cost credits")
        out["after_flush"] = [r(spent), pages, r(spent / price)]
        out["rent"] = r(scheduling.rent(ctx))
        out["latency_type"] = type(scheduling.latency(ctx)).__name__
        check(scheduling.latency(ctx) >= 0, "latency is a duration")

        reference = await ctx.fork().generate(Sampler.argmax(), max_tokens=3, stop=[]).collect_tokens()
        ctx.set_bid(2.5)
        ctx.set_bid(0)
        out["bad_bids"] = [refused(lambda: ctx.set_bid(-1.0)), refused(lambda: ctx.set_bid(float("inf")))]
        with ctx.idle() as same:
            check(same is ctx, "idle() yields the context")
            with ctx.idle():
                first = await ctx.generate(Sampler.argmax(), max_tokens=1, stop=[]).collect_tokens()
        check(not ctx.suspended, "a context that just ran is resident")
        ctx.suspend()
        out["suspended"] = ctx.suspended
        rest = await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[], auto_flush=False).collect_tokens()
        check(first + rest == reference, f"a suspended context continues the same: {first + rest} != {reference}")
        out["resumed"] = [ctx.suspended, first + rest]
        try:
            with ctx.idle():
                raise KeyError("inside idle")
        except KeyError:
            pass
        ctx.set_bid(1.0)  # the context still takes bids after an idle block that raised
        g = ctx.generate(Sampler.argmax(), max_tokens=2, stop=[], horizon=50, auto_flush=False)
        out["horizon_tokens"] = await g.horizon(10).collect_tokens()
    out["end"] = [r(scheduling.dividend(model)), r(start - scheduling.balance(model))]
    released = Context(model)
    released.release()
    out["released"] = [refused(lambda: released.set_bid(1.0)), refused(lambda: released.suspend()),
                       refused(lambda: released.suspended)]
    return out
