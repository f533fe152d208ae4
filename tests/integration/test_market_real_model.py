"""Suspend and restore on the real model: the greedy output of a context that was suspended
(its pages copied to the host pool, or dropped and rebuilt by replay) equals an uninterrupted
run -- mid-generation, under a JSON constraint, after a fork, and when the market itself moves
contexts because the pool is short. Page pool and host pool are whole at the end and credit
is conserved."""

import asyncio

import pytest

from inferlet import Context, Model, Sampler, runtime
from pie_core.host import scheduling as host_scheduling
from pie_core.kv.host_pool import HostPool
from pie_core.kv.context import KvContext

pytestmark = pytest.mark.model

PROMPT = "Name three uses of a paged KV cache in an LLM serving engine, briefly."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "pages": {"type": "integer"}},
          "required": ["name", "pages"]}


@pytest.fixture(params=["offload", "replay"])
def path(request, pie, monkeypatch):
    """Which way suspended contexts go: to the host pool, or dropped (no host pool) and replayed."""
    market = pie.engine.models[pie.model].market
    if request.param == "replay":
        monkeypatch.setattr(market, "host", HostPool(0))
    before = (market.suspensions, market.replays)
    yield request.param
    held, expected = market.ledger.conserved()
    assert held == pytest.approx(expected, rel=1e-9)
    assert market.is_whole()


def _suspend(ctx: Context, pool, path: str) -> None:
    ctx.suspend()
    assert host_scheduling.is_suspended(ctx._handle())
    if path == "replay":
        pool.cache.clear()  # nothing to take back from the prefix cache: replay it all


def test_suspended_mid_generation_continues_exactly(pie, path):
    model_state = pie.engine.models[pie.model]

    async def run(suspend: bool):
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user(PROMPT)
            ctx.cue()
            first = await ctx.generate(Sampler.argmax(), max_tokens=6, stop=[]).collect_tokens()
            if suspend:
                _suspend(ctx, model_state.pool, path)
            second = await ctx.generate(Sampler.argmax(), max_tokens=6, stop=[]).collect_tokens()
            assert not host_scheduling.is_suspended(ctx._handle())
            return first + second

    replays = model_state.market.replays
    assert pie.value(lambda _: run(True)) == pie.value(lambda _: run(False))
    assert (model_state.market.replays > replays) == (path == "replay")


def test_suspended_between_steps_of_a_json_constrained_generation(pie, path):
    model_state = pie.engine.models[pie.model]

    async def run(suspend_at: int | None):
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user("Describe a KV page as JSON with a name and a page count.")
            ctx.cue()
            g = ctx.generate(Sampler.argmax(), max_tokens=14)
            g.constrain(_schema())
            tokens, i = [], 0
            async for step in g:
                out = await step.execute()
                tokens.extend(out.tokens)
                i += 1
                if i == suspend_at:
                    _suspend(ctx, model_state.pool, path)
            return tokens

    assert pie.value(lambda _: run(5)) == pie.value(lambda _: run(None))


def _schema():
    from inferlet.constraints import as_schema

    return as_schema(SCHEMA)


def test_a_fork_of_a_suspended_context_and_the_context_itself_continue_exactly(pie, path):
    model_state = pie.engine.models[pie.model]

    async def run(suspend: bool):
        model = Model.load(runtime.models()[0])
        with Context(model) as base:
            base.user(PROMPT)
            base.cue()
            await base.flush()
            if suspend:
                _suspend(base, model_state.pool, path)
            with base.fork() as child:
                child.append([785])  # a forced first token: the fork goes its own way
                a = await child.generate(Sampler.argmax(), max_tokens=5, stop=[]).collect_tokens()
            b = await base.generate(Sampler.argmax(), max_tokens=5, stop=[]).collect_tokens()
            return a, b

    assert pie.value(lambda _: run(True)) == pie.value(lambda _: run(False))


def test_contexts_moved_by_the_market_finish_like_unhindered_ones(pie, path):
    """Four generators on a pool with room for about two: every one finishes, none fails, and
    each output equals its solo run; the high bidders are never the ones moved first."""
    model_state = pie.engine.models[pie.model]
    market, pool = model_state.market, model_state.pool
    prompts = [f"Count from {i} to {i + 20}, separated by commas:" for i in (1, 30, 60, 90)]

    async def gen(prompt, bid):
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user(prompt)
            ctx.cue()
            g = ctx.generate(Sampler.argmax(), max_tokens=20, stop=[])
            tokens = []
            async for step in g:
                if bid is not None:
                    ctx.set_bid(bid)
                tokens.extend((await step.execute()).tokens)
            return tokens

    solo = [pie.value(lambda _, p=p: gen(p, None)) for p in prompts]
    # Pin all but 10 pages (a blocker in a pass: never moved): each context needs 3-4 pages.
    blocker = KvContext(pool)
    blocker.reserve(pool.available_count - 10)
    hold = market.join(blocker, None)
    hold.busy = True
    moved = market.suspensions
    try:
        together = pie.values_together([lambda _, p=p, b=b: gen(p, b) for p, b in zip(prompts, (9.0, 9.0, 0.5, 0.5))])
    finally:
        blocker.release()
        market.leave(blocker)
    assert together == solo
    assert market.suspensions > moved
