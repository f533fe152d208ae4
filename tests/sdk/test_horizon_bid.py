"""What the docs of ``horizon`` say (inferlet.scheduling, Generator): the market's default bid
spreads the balance over the tokens a generator still expects, so a short horizon bids more per
page than a long one, and with no horizon and no ``max_tokens`` the market assumes 256 tokens."""

from __future__ import annotations

from inferlet import Context, Model, Sampler, runtime
from pie_core.scheduler.market import DEFAULT_REMAINING, default_bid


def test_the_default_bid_is_paced_by_the_horizon(dummy):
    async def main(_):
        model = Model.load(runtime.models()[0])
        with Context(model) as short, Context(model) as long, Context(model) as unknown:
            gens = [short.generate(Sampler.argmax(), max_tokens=1000, horizon=4, stop=[]),
                    long.generate(Sampler.argmax(), max_tokens=1000, horizon=400, stop=[]),
                    unknown.generate(Sampler.argmax(), stop=[])]
            for ctx in (short, long, unknown):
                ctx.user("the same prompt")
            for g in gens:  # two steps each (the prompt, then one token): the same pages, one wallet
                for _ in range(2):
                    await (await g.__anext__()).execute()
            rows = []
            for ctx in (short, long, unknown):
                h = ctx._ctx.holder
                remaining = DEFAULT_REMAINING if h.target is None else h.target - h.kv.length
                formula = default_bid(h.wallet.balance, max(h.pages, 1), remaining, h.kv.page_size, h.wallet.dividend)
                rows.append((h.bid(), formula, remaining, h.pages))
            return rows

    (short, s_formula, s_left, s_pages), (long, l_formula, l_left, l_pages), (unknown, u_formula, u_left, u_pages) = \
        dummy.value(main)
    assert s_pages == l_pages == u_pages
    # the target is set before each step (the length then + tokens left), and the step wrote one
    assert (s_left, l_left, u_left) == (4 - 2, 400 - 2, DEFAULT_REMAINING)
    assert (short, long, unknown) == (s_formula, l_formula, u_formula)
    assert short > unknown > long > 0
