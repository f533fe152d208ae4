"""LoRA adapters and zo: create/open/name/fork, save and load through PEFT folders in the
user's scratch directory, zo.initialize and zo.update, generation and passes under an adapter
and a zo seed (the dummy backend holds adapters without weights: the tokens stay the base
model's), and the refusals of bad calls."""

import os

from inferlet import Adapter, Context, Model, Sampler, runtime, zo


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def refused(fn):
    try:
        value = fn()
        if hasattr(value, "__await__"):
            await value
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]
    return None


async def tokens(model, **options):
    with Context(model) as ctx:
        ctx.user("Adapt me.")
        return await ctx.generate(Sampler.argmax(), max_tokens=3, stop=[], **options).collect_tokens()


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    base = await tokens(model)
    a = Adapter.create(model, "runners-a")
    check(a.model == model, "an adapter knows its model")
    out["names"] = [a.name, repr(a), Adapter.open(model, "runners-a").name, Adapter.open(model, "runners-none")]
    out["duplicate"] = await refused(lambda: Adapter.create(model, "runners-a"))
    out["empty_name"] = await refused(lambda: Adapter.create(model, ""))
    out["zo_before_init"] = await refused(lambda: zo.update(a, [1.0, 0.0], [1, 2], 0.1))
    with Context(model) as ctx:
        ctx.user("Adapt me.")
        out["seed_without_adapter"] = await refused(lambda: ctx.generate(Sampler.argmax(), max_tokens=1,
                                                                          zo_seed=5).collect_tokens())
    await zo.initialize(a, rank=2, alpha=4.0, population_size=2, mu_fraction=0.5, initial_sigma=0.1)
    out["bad_init"] = await refused(lambda: zo.initialize(a, rank=0, alpha=1.0, population_size=2, mu_fraction=0.5,
                                                          initial_sigma=0.1))
    out["wrong_population"] = await refused(lambda: zo.update(a, [1.0, 2.0, 3.0], [1, 2, 3], 0.1))

    with_adapter = await tokens(model, adapter=a)
    seeded = [await tokens(model, adapter=a, zo_seed=s) for s in (3, 4)]
    check(with_adapter == base and seeded == [base, base], "the dummy backend's tokens ignore adapters")
    with Context(model) as ctx:
        ctx.user("Adapt me.")
        g = ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).adapter(a).zo_seed(3)
        out["builder"] = await g.collect_tokens()
        fwd = ctx.forward().adapter(a).zo_seed(4)
        fwd.input([1, 2])
        h = fwd.sample([1], Sampler.argmax())
        out["forward"] = (await fwd.execute()).token(h)
    await zo.update(a, [1.0, 0.0], [3, 4], max_sigma=0.2)

    b = a.fork("runners-b")
    out["fork"] = b.name
    folder = "runners-suite/adapter-a"
    await a.save(folder)
    saved = sorted(os.listdir(runtime.scratch_path(folder)))
    out["saved_files"] = saved
    with Adapter.create(model, "runners-c") as c:
        await c.load(folder)
        out["loaded"] = await tokens(model, adapter=c)
    check(Adapter.open(model, "runners-c") is None, "leaving the with block releases the adapter")
    out["load_missing"] = await refused(lambda: b.load("runners-suite/no-such-adapter"))
    out["escape"] = await refused(lambda: b.save("../outside"))
    for name in saved:
        os.remove(os.path.join(runtime.scratch_path(folder), name))
    os.rmdir(runtime.scratch_path(folder))
    out["base"] = base
    return out
