"""Snapshots outlive contexts and inferlets: save/open/take/delete and runtime-named snapshots
within this run, a spawned child (snapshot-reader) that opens one, and one left under
``input["later"]`` for a later run of snapshot-reader to take."""

from inferlet import Context, Model, Sampler, runtime


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def continuation(ctx, n=3):
    return await ctx.generate(Sampler.argmax(), max_tokens=n, stop=[]).collect_tokens()


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    with Context(model) as ctx:
        ctx.system("Remember this.").user("The word is pie.")
        await ctx.flush()
        ctx.append([42])  # a buffered token travels with the snapshot
        expected = await continuation(ctx.fork())

        ctx.save("runners-saved")
        check(Context.open(model, "runners-missing") is None, "open of an absent snapshot is None")
        check(Context.take(model, "runners-missing") is None, "take of an absent snapshot is None")
        opened = Context.open(model, "runners-saved")
        out["opened"] = [opened.seq_len, opened.buffer(), opened.name]
        check(await continuation(opened) == expected, "an opened snapshot continues as the context would")
        opened.release()
        again = Context.open(model, "runners-saved")  # open clones: the snapshot stays
        check(again is not None, "open leaves the snapshot in place")
        again.release()

        name = ctx.snapshot()
        check(isinstance(name, str) and name != "runners-saved", "snapshot() names a new snapshot")
        taken = Context.take(model, name)
        check(Context.open(model, name) is None, "take removes the snapshot")
        check(await continuation(taken) == expected, "a taken snapshot continues as the context would")
        taken.release()

        child = await runtime.spawn(input["reader"], {"name": "runners-saved", "mode": "open"})
        check(child["tokens"] == expected, f"the child's continuation {child['tokens']} != {expected}")
        out["child"] = child
        Context.delete(model, "runners-saved")
        check(Context.open(model, "runners-saved") is None, "delete drops the snapshot")
        Context.delete(model, "runners-saved")  # deleting an absent snapshot

        ctx.save(input["later"])
        out["expected"] = expected
    return out
