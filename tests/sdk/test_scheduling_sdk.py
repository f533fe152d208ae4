"""The KV-page market from an inferlet: ``inferlet.scheduling`` and the Context's bid hooks.

Tests peek at the engine's record of a context (``ctx._ctx.holder``: its bid, idle flag and
the length its generator expects) the way other SDK tests peek at ``ctx._ctx.kv``.
"""

import math

import pytest

from inferlet import Context, Model, Sampler, runtime, scheduling
from pie_core.errors import InvalidInput
from pie_core.host import scheduling as host_scheduling
from pie_core.scheduler.credits import DEFAULT_ENDOWMENT
from pie_core.scheduler.market import DEFAULT_REMAINING, default_bid


def _model() -> Model:
    return Model.load(runtime.models()[0])


def test_scheduling_is_exported_with_the_reference_functions():
    import inferlet

    assert inferlet.scheduling is scheduling
    assert set(scheduling.__all__) == {"balance", "rent", "dividend", "latency", "price"}


def test_balance_starts_at_the_endowment_and_pays_the_price_per_new_page(dummy):
    async def main(_):
        model = _model()
        start = scheduling.balance(model)
        with Context(model) as ctx:
            ctx.append(list(range(100, 140)))
            await ctx.flush()
            raw = ctx.inner()
            pages = raw.committed_page_count() + raw.working_page_count()
            after = scheduling.balance(model)
            quiet = scheduling.rent(ctx), scheduling.dividend(model), scheduling.latency(ctx)
        return start, after, pages, scheduling.price(), quiet

    start, after, pages, price, (rent, dividend, latency) = dummy.value(main)
    assert start == DEFAULT_ENDOWMENT
    assert pages > 0 and price > 0
    assert after == pytest.approx(start - price * pages)
    assert rent == 0.0 and dividend == 0.0  # no contention: nobody pays rent
    assert latency >= 0.0


def test_set_bid_overrides_one_pass_then_the_default_bid_returns(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            holder = ctx._ctx.holder
            default = holder.bid()
            ctx.set_bid(7.5)
            before = holder.override, holder.bid()
            ctx.append([1, 2, 3])
            await ctx.flush()
            w = holder.wallet  # the default bid, from the balance left after paying for a page
            paced = default_bid(w.balance, holder.pages, DEFAULT_REMAINING, ctx.page_size, w.dividend)
            return default, before, holder.override, holder.bid(), paced

    default, (override, bid), spent, after, paced = dummy.value(main)
    assert override == 7.5 and bid == 7.5 and 0 < default < 7.5
    assert spent is None and after == pytest.approx(paced)


@pytest.mark.parametrize("bad, message", [
    (-1.0, "a bid must be a finite number >= 0, got -1.0"),
    (math.nan, "a bid must be a finite number >= 0, got nan"),
    (math.inf, "a bid must be a finite number >= 0, got inf"),
    (True, "scheduling.set_bid(): value must be a float, got True"),  # not a float: the SDK's declaration
    ("3", "scheduling.set_bid(): value must be a float, got str"),
])
def test_a_bid_that_is_not_a_finite_number_at_least_zero_is_refused(dummy, bad, message):
    async def main(_):
        with Context(_model()) as ctx:
            with pytest.raises(InvalidInput) as info:
                ctx.set_bid(bad)
            return str(info.value), ctx._ctx.holder.override

    text, override = dummy.value(main)
    assert text == message and override is None


def test_idle_bids_zero_for_the_block_and_resumes_after(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            holder = ctx._ctx.holder
            ctx.set_bid(2.0)
            with ctx.idle() as same:
                inside = holder.idle, holder.bid(), same is ctx
            return inside, holder.idle, holder.bid()

    (idle, bid, same), after_idle, after_bid = dummy.value(main)
    assert idle and bid == 0.0 and same
    assert not after_idle and after_bid == 2.0


def test_idle_resumes_bidding_when_the_block_raises(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            with pytest.raises(RuntimeError, match="tool failed"):
                with ctx.idle():
                    raise RuntimeError("tool failed")
            return ctx._ctx.holder.idle

    assert dummy.value(main) is False


def test_nested_idle_blocks_resume_bidding_when_the_outermost_ends(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            holder = ctx._ctx.holder
            with ctx.idle():
                with ctx.idle():
                    pass
                still = holder.idle
            return still, holder.idle

    assert dummy.value(main) == (True, False)


def test_leaving_idle_after_release_is_quiet(dummy):
    async def main(_):
        ctx = Context(_model())
        with ctx.idle():
            ctx.release()
        return "ok"

    assert dummy.value(main) == "ok"


async def _greedy(prompt: str, suspend: bool) -> tuple[list[int], list[bool], int]:
    """Greedy tokens after ``prompt``, optionally suspending the context after its prefill;
    also ``ctx.suspended`` around the generation and the pages given back."""
    with Context(_model()) as ctx:
        ctx.user(prompt)
        await ctx.flush()
        seen = [ctx.suspended]
        freed = 0
        if suspend:
            pool = ctx._ctx.model.pool
            before = pool.used_count
            ctx.suspend()
            freed = before - pool.used_count
            seen.append(ctx.suspended)
        tokens = await ctx.generate(Sampler.argmax(), max_tokens=8, stop=[]).collect_tokens()
        seen.append(ctx.suspended)
        return tokens, seen, freed


def test_a_suspended_context_comes_back_and_generates_the_same_tokens(dummy):
    async def main(_):
        return await _greedy("tell me a story", False), await _greedy("tell me a story", True)

    (plain, plain_seen, _), (resumed, seen, freed) = dummy.value(main)
    assert resumed == plain and len(plain) == 8
    assert plain_seen == [False, False]
    assert seen == [False, True, False]
    assert freed > 0  # its pages really went back to the pool


def _drive_and_record(horizon, max_tokens):
    """Run a generator step by step; per step the target the engine held after it, what
    ``seq_len + tokens still expected`` was before it, and whether it finished."""

    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("count to ten")
            holder = ctx._ctx.holder
            g = ctx.generate(Sampler.argmax(), max_tokens=max_tokens, horizon=horizon, stop=[])
            rows = []
            async for step in g:
                got = g.tokens_generated
                left = horizon - got if horizon is not None and horizon > got else max_tokens - got
                expected = ctx.seq_len + left
                await step.execute()
                rows.append((holder.target, expected, g.is_done))
            return rows

    return main


def test_the_generator_tells_the_market_its_horizon_and_withdraws_it_at_the_end(dummy):
    rows = dummy.value(_drive_and_record(horizon=5, max_tokens=8))
    assert len(rows) == 8
    for target, expected, done in rows:
        assert target == (None if done else expected)
    assert rows[-1][0] is None


def test_without_a_horizon_max_tokens_paces_the_bid(dummy):
    rows = dummy.value(_drive_and_record(horizon=None, max_tokens=6))
    assert [t for t, _, _ in rows[:-1]] == [e for _, e, _ in rows[:-1]]
    assert rows[-1][0] is None


def test_the_horizon_costs_a_host_call_only_when_the_expectation_changes(dummy, observed):
    calls = []

    def counting(ctx, tokens):
        calls.append(tokens)
        host_scheduling.set_horizon(ctx, tokens)

    observed.override(("scheduling", "set_horizon"), counting)

    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("count to ten")
            return await ctx.generate(Sampler.argmax(), max_tokens=12, horizon=12, stop=[]).collect_tokens()

    assert len(dummy.value(main)) == 12
    # the first step (the prompt), the second (one token at a time from then on), and the end
    assert calls == [12, 11, None]


def test_a_new_generator_clears_an_abandoned_generators_horizon(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("count to ten")
            holder = ctx._ctx.holder
            first = ctx.generate(Sampler.argmax(), max_tokens=8, stop=[])
            await (await first.__anext__()).execute()  # abandoned after one step
            stale = holder.target
            second = ctx.generate(Sampler.argmax(), stop=[], auto_flush=False)
            await (await second.__anext__()).execute()
            return stale, holder.target

    stale, after = dummy.value(main)
    assert stale is not None and after is None
