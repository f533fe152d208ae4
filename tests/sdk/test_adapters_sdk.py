"""The Adapter and zo SDK on the dummy backend (which holds adapters but has no weights): names
per user, lifetimes, argument errors, and KV pages computed under an adapter kept apart from
the base model's in the prefix cache."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from inferlet import Adapter, Context, Model, Sampler, runtime, zo
from pie_core.errors import InvalidInput


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _store(dummy):
    return dummy.engine.adapters


def test_an_adapter_lives_while_a_handle_holds_it(dummy):
    async def main(_):
        model = _model()
        a = Adapter.create(model, "style")
        again = Adapter.open(model, "style")
        assert again is not None and again.name == "style" and Adapter.open(model, "other") is None
        with pytest.raises(InvalidInput, match="exists"):
            Adapter.create(model, "style")
        del a
        gc.collect()
        assert Adapter.open(model, "style") is not None  # `again` still holds it
        with again:
            pass  # leaving the block releases that handle
        del again
        gc.collect()
        found = Adapter.open(model, "style")
        with Adapter.create(model, "scoped"):
            pass
        return found is None, Adapter.open(model, "scoped") is None

    assert dummy.value(main) == (True, True)
    assert _store(dummy).bytes_held() == {}


def test_the_inferlets_end_releases_what_it_held(dummy):
    async def main(_):
        model = _model()
        keep = [Adapter.create(model, f"a{i}") for i in range(3)]
        return len(keep)

    assert dummy.value(main) == 3
    assert _store(dummy).bytes_held() == {}


def test_fork_and_save_load_go_through_peft_files(dummy, tmp_path):
    async def main(_):
        model = _model()
        a = Adapter.create(model, "base")
        zo.initialize(a, rank=2, alpha=4.0, population_size=2, mu_fraction=0.5, initial_sigma=0.1)
        b = a.fork("copy")
        zo.update(b, [1.0, 0.0], [3, 4], max_sigma=0.2)  # only the fork moves
        await a.save(str(tmp_path / "a"))
        await b.save(str(tmp_path / "b"))
        c = Adapter.create(model, "loaded")
        await c.load(str(tmp_path / "b"))
        await c.save(str(tmp_path / "c"))
        return "ok"

    assert dummy.value(main) == "ok"
    from safetensors.numpy import load_file

    a, b, c = (load_file(tmp_path / x / "adapter_model.safetensors") for x in "abc")
    assert a.keys() == b.keys() == c.keys()
    key = next(k for k in a if "lora_B" in k)
    assert not a[key].any() and b[key].any()  # B starts at 0; the update moved the fork's
    for k in b:
        np.testing.assert_array_equal(b[k], c[k])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda m, a: zo.update(a, [1.0, 2.0], [1, 2], 0.1), "zo.initialize first"),
        (lambda m, a: Adapter.create(m, ""), "non-empty"),
        (lambda m, a: a.load("/nonexistent-folder"), "adapter_config.json"),
        (lambda m, a: zo.initialize(a, rank=0, alpha=1.0, population_size=4, mu_fraction=0.5, initial_sigma=0.1), "rank"),
        (lambda m, a: zo.initialize(a, rank=2, alpha=1.0, population_size=1, mu_fraction=0.5, initial_sigma=0.1),
         "population_size"),
        (lambda m, a: zo.initialize(a, rank=2, alpha=1.0, population_size=4, mu_fraction=0.0, initial_sigma=0.1),
         "mu_fraction"),
    ],
)
def test_bad_adapter_calls_are_refused_clearly(dummy, call, match):
    async def main(_):
        model = _model()
        with Adapter.create(model, "x") as a:
            with pytest.raises(InvalidInput, match=match):
                call(model, a)
        return "ok"

    assert dummy.value(main) == "ok"


def test_a_zo_update_takes_one_score_per_candidate(dummy):
    async def main(_):
        with Adapter.create(_model(), "es") as a:
            zo.initialize(a, rank=2, alpha=4.0, population_size=4, mu_fraction=0.5, initial_sigma=0.1)
            with pytest.raises(InvalidInput, match="population is 4"):
                zo.update(a, [1.0, 2.0], [1, 2], 0.1)
        return "ok"

    assert dummy.value(main) == "ok"


def test_zo_seed_needs_an_initialised_adapter(dummy):
    async def main(_):
        model = _model()
        out = []
        with Adapter.create(model, "plain") as a, Context(model) as ctx:
            ctx.append([1, 2, 3])
            for kwargs in ({"zo_seed": 5}, {"adapter": a, "zo_seed": 5}):
                try:
                    await ctx.generate(Sampler.argmax(), max_tokens=1, auto_flush=False, **kwargs).collect_tokens()
                    out.append("ran")
                except InvalidInput as exc:
                    out.append(str(exc))
        return out

    without, uninitialised = dummy.value(main)
    assert "pass adapter=" in without and "zo.initialize" in uninitialised


def test_pages_computed_under_an_adapter_are_not_shared_with_the_base_model(dummy):
    prompt = list(range(100, 164))  # four 16-token pages

    async def main(_):
        model = _model()
        with Adapter.create(model, "a") as a, Adapter.create(model, "b") as b:
            pages = {}
            for label, adapter in (("plain", None), ("plain2", None), ("a", a), ("a2", a), ("b", b)):
                with Context(model) as ctx:
                    fwd = ctx.forward()
                    fwd.input(prompt)
                    if adapter is not None:
                        fwd.adapter(adapter)
                    await fwd.execute()
                    pages[label] = list(ctx._handle().kv.pages[:4])
            return pages

    pages = dummy.value(main)
    assert pages["plain"] == pages["plain2"] and pages["a"] == pages["a2"]  # each shares with its own kind
    assert not set(pages["plain"]) & set(pages["a"]) and not set(pages["a"]) & set(pages["b"])


def test_an_adapter_released_as_its_loop_closes_is_freed_before_its_id_is_reused(dummy, tmp_path):
    # Each dummy.value runs its own event loop; the release queued as the first one ends must
    # still reach the backend before the second creates an adapter (which gets the same id).
    async def make(_):
        a = Adapter.create(_model(), "short-lived")
        await a.save(str(tmp_path / "x"))  # raises if the backend refused the create
        return "made"

    assert dummy.value(make) == "made"
    assert dummy.value(make) == "made"
    assert _store(dummy).bytes_held() == {}


def test_more_adapters_than_the_backend_holds_take_turns_in_its_slots(dummy, tmp_path):
    """The dummy backend holds 32 adapters at once; 40 live ones, all run concurrently, park and
    page in, and no batch names more than 32."""
    import asyncio

    from pie_core.backend_kit.dummy import MAX_ADAPTERS as HELD

    worker = dummy.engine.models[next(iter(dummy.engine.models))].worker
    forward, sizes = worker.forward, []

    def counting(batch, loop):
        sizes.append(len({int(a) for a in batch.adapter_ids if a >= 0}))
        return forward(batch, loop)

    async def main(_):
        model = _model()
        adapters = [Adapter.create(model, f"many{i}") for i in range(HELD + 8)]

        async def one(adapter):
            with Context(model) as ctx:
                fwd = ctx.forward()
                fwd.input([1, 2, 3])
                fwd.adapter(adapter)
                await fwd.execute()
            await adapter.save(str(tmp_path / adapter.name))  # raises if the backend refused anything
            return adapter.name

        return len(set(await asyncio.gather(*(one(a) for a in adapters))))

    worker.forward = counting
    try:
        assert dummy.value(main) == HELD + 8
    finally:
        worker.forward = forward
    assert sizes and max(sizes) <= HELD
    assert worker._calls.adapters is not None and worker._calls.adapters.parks >= 8
    assert _store(dummy).bytes_held() == {}
