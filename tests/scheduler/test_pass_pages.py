"""A pass gets its pages from the market, never behind its back: run_pass asks admission for
what the context says the pass needs, a pass queued ahead reserves for the slot it writes at,
and a fork that cannot buy pages for its working copy starts suspended instead of failing."""

from __future__ import annotations

import asyncio

import numpy as np

from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.host import context as host_context
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
from pie_core.scheduler.passes import Pass, queue_unrecorded
from pie_core.values import SampleSpec

PS = 4


def _engine(pages: int = 16) -> tuple[Engine, object]:
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=pages))
    return engine, engine.load(None)


def _run(engine: Engine, main) -> object:
    try:
        final = asyncio.run(run_main(engine, main, {}, lambda event: None))
    finally:
        asyncio.run(engine.close())
    assert final.kind == "return", final.value
    assert engine.pools_whole(), "pages were left allocated"
    return final.value


def _recording(market, name: str) -> list[int]:
    """Record the page counts ``market.<name>`` is called with."""
    asked: list[int] = []
    method = getattr(market, name)

    def wrapped(holder, new):
        asked.append(new)
        return method(holder, new)

    setattr(market, name, wrapped)
    return asked


def test_admission_is_asked_for_exactly_the_pages_each_pass_adds():
    engine, model = _engine()
    asked = _recording(model.market, "admit")

    async def main(_):
        ctx = host_context.create(model.name)
        held = []
        for n in (5, 3, 1, 7):  # 2 pages; 8 tokens fit them; a third; 16 tokens on 4 pages
            await forward(ctx, [100 + ctx.kv.length + i for i in range(n)], samples=[SampleSpec(index=n - 1)])
            held.append(len(ctx.kv.pages))
        ctx.release()
        return held

    assert _run(engine, main) == [2, 2, 3, 4]
    assert asked == [2, 0, 1, 1]


def test_a_pass_queued_ahead_reserves_through_the_market_for_the_slot_it_writes():
    engine, model = _engine()
    asked = _recording(model.market, "reserve_now")

    async def main(_):
        ctx = host_context.create(model.name)
        await forward(ctx, [100, 101, 102], samples=[SampleSpec(index=2)])  # slots 0..2: page 0
        work = Pass(np.array([7], np.int32), np.array([4], np.int32), samples=(SampleSpec(index=0),))
        future = queue_unrecorded(model, ctx.holder, work, at=4)  # slot 4 starts page 1
        assert future is not None and len(ctx.kv.pages) == 2
        future.cancel()
        ctx.release()

    _run(engine, main)
    assert asked == [1]


def test_a_fork_that_cannot_buy_its_working_copy_starts_suspended():
    engine, model = _engine(pages=16)

    async def main(_):
        source = host_context.create(model.name)
        await forward(source, [100 + i for i in range(6)], samples=[SampleSpec(index=5)])  # 2 pages, 1 to copy
        rich = host_context.create(model.name)
        await forward(rich, [500 + i for i in range(56)], samples=[SampleSpec(index=55)])  # the other 14
        rich.holder.override = 1e9  # outbids the fork: its pages are not for sale
        assert model.pool.free_count == 0
        clone = host_context.fork(source)
        state = (clone.kv.resident, clone.kv.held_pages, model.pool.free_count)
        for ctx in (clone, rich, source):
            ctx.release()
        return state

    assert _run(engine, main) == (False, 2, 0)
