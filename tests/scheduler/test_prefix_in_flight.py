"""Contexts opening on one prompt at once compute it once: a pass whose next full pages another
pass is computing waits for that pass to land and adopts them from the prefix cache; if the
other pass fails or is cancelled, the waiter computes them itself."""

from __future__ import annotations

import asyncio

from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.host import context as host_context
from pie_core.host.inference import forward
from pie_core.runtime.instance import run_main
from pie_core.values import SampleSpec

PS = 4
PROMPT = [100 + i for i in range(3 * PS)]  # three full pages


def _run(main, step_ms: float = 0.0) -> object:
    engine = Engine("dummy", options=BackendOptions(page_size=PS, kv_pages=32, extra={"step_ms": step_ms}))
    model = engine.load(None)
    try:
        final = asyncio.run(run_main(engine, lambda _: main(model), {}, lambda event: None))
    finally:
        asyncio.run(engine.close())
    assert final.kind == "return", final.value
    assert engine.pools_whole(), "pages were left allocated"
    return final.value


async def _open(model, last: int) -> tuple[object, list[int]]:
    ctx = host_context.create(model.name)
    await forward(ctx, PROMPT + [last], samples=[SampleSpec(index=len(PROMPT))])
    return ctx, list(ctx.kv.pages)


async def _until(condition, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


def test_eight_contexts_opening_on_one_prompt_compute_it_once():
    async def main(model):
        stats, cache = model.batcher.stats, model.pool.cache
        opened = await asyncio.wait_for(asyncio.gather(*(_open(model, 900 + i) for i in range(8))), 10)
        shared = {tuple(pages[:3]) for _, pages in opened}
        computed, waits = stats.tokens, cache.waits
        for ctx, _ in opened:
            ctx.release()
        return len(shared), computed, waits

    shared, computed, waits = _run(main)
    assert shared == 1  # every context holds the first one's three prompt pages
    assert computed == len(PROMPT) + 8  # the prompt once, then each context's own last token
    assert waits == 7


def test_a_waiter_computes_the_pages_itself_when_the_pass_it_waited_for_is_cancelled():
    async def main(model):
        cache = model.pool.cache
        first = asyncio.ensure_future(_open(model, 900))
        await _until(lambda: cache._computing, "the first pass announced its pages")
        second = asyncio.ensure_future(_open(model, 901))
        await _until(lambda: cache.waits == 1, "the second pass waits for the first")
        first.cancel()
        ctx, pages = await asyncio.wait_for(second, 10)
        computed = model.batcher.stats.tokens
        assert not cache._computing
        ctx.release()
        return len(pages), computed

    pages, computed = _run(main, step_ms=300)  # the first batch is still running when it is cancelled
    assert pages == 4 and computed == 2 * len(PROMPT) + 2  # the cancelled pass ran, but its pages were not kept
