"""The market over a real page pool: grants, auctions, suspension (copy or drop), restores."""

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pie_core.errors import OutOfPages, PieError
from pie_core.hookspec import CopyKind
from pie_core.kv.context import KvContext
from pie_core.kv.host_pool import HostPool
from pie_core.kv.pool import PagePool
from pie_core.scheduler.credits import Ledger
from pie_core.scheduler.market import Market, default_bid

PS = 4


class Copies(list):
    def __call__(self, kind, src, dst):
        assert len(src) == len(dst)
        self.append((kind, list(src), list(dst)))


def _market(pages=8, host=8):
    pool = PagePool(pages, PS)
    copies = Copies()
    return Market(pool, HostPool(host), copies, Ledger(100.0)), copies


def _holder(market, key, bid=None, tokens=0):
    kv = KvContext(market.pool)
    holder = market.join(kv, market.ledger.join(key, key))
    if tokens:
        _fill(market, holder, tokens)
    holder.override = bid
    return holder


_BASE = iter(range(0, 10**9, 1000))  # distinct tokens per fill: no two contexts share a cached page


def _fill(market, holder, n):
    async def go():
        await market.admit(holder, -(-(holder.kv.length + n) // PS) - len(holder.kv.pages))
        holder.kv.plan_write(n)
        base = next(_BASE)
        holder.kv.advance(list(range(base, base + n)), list(range(holder.kv.length, holder.kv.length + n)))
        bid = holder.override
        market.done(holder)
        holder.override = bid

    asyncio.run(go())


def _finish(market, *holders):
    for h in holders:
        h.kv.release()
        market.leave(h.kv)
    assert market.pool.is_whole() and market.is_whole()


def test_default_bid_spends_the_balance_over_the_expected_pages():
    assert default_bid(100.0, 4, 64, 16, 0.0) == pytest.approx((100 / 64) / (4 + 64 * 2 / 32))
    assert default_bid(100.0, 4, 64, 16, 0.0) > default_bid(100.0, 4, 64, 16, 0.0) * 0.5
    assert default_bid(-5.0, 4, 64, 16, 0.0) == 0.0
    assert default_bid(100.0, 4, 8, 16, 0.0) > default_bid(100.0, 4, 512, 16, 0.0)  # near the end: bid more


def test_grant_without_contention_is_immediate_and_burns_the_make_cost():
    market, copies = _market()
    a = _holder(market, "a")
    _fill(market, a, 6)
    assert len(a.kv.pages) == 2 and a.wallet.balance == 98.0 and not a.busy and not copies
    _finish(market, a)


def test_a_waiter_outbidding_an_idle_holder_takes_its_pages_by_host_copy():
    market, copies = _market(pages=8, host=8)
    rich, poor = _holder(market, "rich", bid=5.0, tokens=16), _holder(market, "poor", bid=1.0, tokens=16)
    assert market.pool.available_count == 0
    mid = _holder(market, "mid", bid=3.0)

    async def go():
        await market.admit(mid, 4)
        market.done(mid)

    asyncio.run(go())
    assert not poor.kv.resident and poor.kv.offloaded and rich.kv.resident and len(mid.kv.pages) == 4
    assert copies[0][0] == CopyKind.DEVICE_TO_HOST and len(copies[0][1]) == 4
    assert market.price == 1.0  # the highest excluded bid
    _finish(market, rich, poor, mid)


def test_without_host_room_the_loser_is_dropped_and_replayed_on_restore():
    market, copies = _market(pages=8, host=0)
    a, b = _holder(market, "a", bid=1.0, tokens=14), _holder(market, "b", bid=2.0)

    async def go():
        await market.admit(b, 6)
        market.done(b)
        b.kv.release()
        market.leave(b.kv)
        grant = await market.admit(a, 0)  # a's next pass: restored, to be replayed
        # b's pages evicted a's last cached page; its first two full pages came back from the cache.
        assert a.kv.resident and grant.replay_from == 8
        market.done(a)

    asyncio.run(go())
    assert not copies and market.replays == 1
    _finish(market, a)


def test_a_waiter_outbid_by_everyone_waits_until_pages_free_then_runs():
    market, _ = _market(pages=8, host=0)
    a, b = _holder(market, "a", bid=5.0, tokens=16), _holder(market, "b", bid=5.0, tokens=16)
    low = _holder(market, "low", bid=1.0)
    order = []

    async def go():
        async def wait_low():
            await market.admit(low, 2)
            order.append("low")
            market.done(low)

        task = asyncio.create_task(wait_low())
        await asyncio.sleep(0)
        assert not task.done() and a.kv.resident and b.kv.resident
        order.append("release")
        a.kv.release()
        market.leave(a.kv)
        await task

    asyncio.run(go())
    assert order == ["release", "low"]
    _finish(market, b, low)


def test_only_a_context_larger_than_the_pool_gets_out_of_pages():
    market, _ = _market(pages=4)
    a = _holder(market, "a")
    with pytest.raises(OutOfPages, match="pool has 4"):
        asyncio.run(market.admit(a, 5))
    _finish(market, a)


def test_parked_contexts_come_back_on_their_next_pass_with_a_host_copy():
    market, copies = _market(pages=8, host=8)
    a = _holder(market, "a", tokens=10)
    pages = list(a.kv.pages)
    market.park(a)
    assert not a.kv.resident and a.parked and market.pool.is_whole()
    market.settle()
    assert not a.kv.resident  # parked: not restored while idle

    async def go():
        grant = await market.admit(a, 0)
        market.done(a)
        return grant

    grant = asyncio.run(go())
    assert a.kv.resident and grant.replay_from is None
    assert [c[0] for c in copies] == [CopyKind.DEVICE_TO_HOST, CopyKind.HOST_TO_DEVICE]
    # Committed pages still in the prefix cache are taken back as they are; only the rest is copied.
    assert copies[0][1] == pages and copies[1][1] == copies[0][2][2:] and a.kv.pages[:2] == pages[:2]
    assert copies[1][2] == a.kv.pages[2:]
    _finish(market, a)


def test_busy_holders_are_never_moved():
    market, _ = _market(pages=4)
    a = _holder(market, "a", tokens=8)
    a.busy = True
    assert not market.suspend(a)
    with pytest.raises(PieError, match="in a pass"):
        market.park(a)
    a.busy = False
    _finish(market, a)


def test_take_now_suspends_lower_bids_only():
    market, _ = _market(pages=8)
    low, high = _holder(market, "low", bid=1.0, tokens=16), _holder(market, "high", bid=9.0, tokens=16)
    assert not market.take_now(2, 0.5)
    assert market.take_now(2, 5.0) and not low.kv.resident and high.kv.resident
    _finish(market, low, high)


def test_rent_is_charged_at_the_clearing_price_and_returned_as_dividends():
    market, copies = _market(pages=8, host=8)
    a, b = _holder(market, "a", bid=4.0, tokens=16), _holder(market, "b", bid=1.0, tokens=16)
    c = _holder(market, "c", bid=2.0)

    async def go():
        # c wants the whole pool: c alone offers 2.0 x 8 = 16 per tick, a and b together
        # 4.0 x 4 + 1.0 x 4 = 20, so nobody moves and the clearing price is c's excluded bid.
        task = asyncio.create_task(market.admit(c, 8))
        await asyncio.sleep(0.01)  # the auction runs once the round of arrivals has queued
        assert market.price == 2.0 and not task.done() and not copies
        assert a.kv.resident and b.kv.resident
        market.tick(0.01)  # rent min(bid, 2.0) per page: a pays 2.0 x 4, b 1.0 x 4; 12 split 3 ways
        assert (a.rent, b.rent, c.rent) == (2.0, 2.0, 2.0)
        assert [w.dividend for w in (a.wallet, b.wallet, c.wallet)] == [4.0, 4.0, 4.0]
        assert (a.wallet.balance, b.wallet.balance, c.wallet.balance) == (100 - 4 - 8 + 4, 100 - 4 - 4 + 4, 100 + 4)
        held, expected = market.ledger.conserved()
        assert held == pytest.approx(expected)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    _finish(market, a, b, c)


actions = st.lists(
    st.tuples(st.sampled_from(["fill", "park", "release", "truncate", "tick", "bid"]), st.integers(0, 4), st.integers(1, 9)),
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(actions, st.integers(0, 6))
def test_pages_slots_and_credit_are_conserved(steps, host):
    market, _ = _market(pages=10, host=host)
    holders = [_holder(market, f"h{i}", bid=float(i)) for i in range(5)]
    for action, who, n in steps:
        h = holders[who]
        if h.kv.released:
            continue
        if action == "fill" and h.pages + -(-n // PS) + 1 <= 10:
            asyncio.run(_fill_or_give_up(market, h, n))
        elif action == "park" and h.kv.resident and h.kv.pages:
            try:
                market.park(h)
            except PieError:
                pass  # neither host room nor replay
        elif action == "release":
            h.kv.release()
            market.leave(h.kv)
        elif action == "truncate":
            h.kv.truncate(min(n, h.kv.working_tokens))
        elif action == "tick":
            market.tick(0.01)
        elif action == "bid":
            h.override = float(n)
        held, expected = market.ledger.conserved()
        assert held == pytest.approx(expected, rel=1e-9, abs=1e-9)
        refs = market.pool.refs_of(np.arange(10))
        assert market.pool.free_count == int((refs == 0).sum())
        assert market.host.free_count + sum(len(x.kv.host_pages) for x in holders) == host
    _finish(market, *[h for h in holders if not h.kv.released])


async def _fill_or_give_up(market, holder, n, turns=20):
    """Fill, or give up once the auction it started has run without granting it (outbid: it
    would wait for a tick that never comes). The market has no timers: a grant comes within a
    few turns of the event loop or not at all, so the outcome does not depend on the clock."""
    task = asyncio.create_task(_fill_async(market, holder, n))
    for _ in range(turns):
        if task.done():
            return task.result()
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _fill_async(market, holder, n):
    grant = await market.admit(holder, holder.kv.pages_needed(n))
    try:
        if grant.replay_from is not None:
            holder.kv.replayed()
        holder.kv.plan_write(n)
        base = next(_BASE)
        holder.kv.advance(list(range(base, base + n)), list(range(holder.kv.length, holder.kv.length + n)))
    finally:
        market.done(holder)


def test_an_override_bid_counts_only_as_far_as_the_balance_pays():
    market, _ = _market()
    a = _holder(market, "a", bid=1e9, tokens=8)
    assert a.bid() == pytest.approx(a.wallet.balance / 2)
    a.wallet.balance = -5.0
    assert a.bid() == 0.0
    _finish(market, a)


def test_a_waiter_one_page_short_keeps_waiting_instead_of_failing():
    market, _ = _market(pages=8, host=0)
    a = _holder(market, "a", bid=5.0, tokens=20)  # 5 pages: 3 left
    w = _holder(market, "w", bid=1.0)

    async def go():
        task = asyncio.create_task(market.admit(w, 4))
        await asyncio.sleep(0.01)
        assert not task.done() and w in market.waiters  # one page short: neither granted nor failed
        a.kv.release()
        market.leave(a.kv)
        await task
        market.done(w)

    asyncio.run(go())
    _finish(market, w)


def test_only_as_many_losers_move_as_the_winner_needs():
    market, _ = _market(pages=12, host=12)
    low1, low2 = _holder(market, "low1", bid=1.0, tokens=16), _holder(market, "low2", bid=1.5, tokens=16)
    mid = _holder(market, "mid", bid=9.0, tokens=16)
    w = _holder(market, "w", bid=5.0)

    async def go():
        await market.admit(w, 3)
        market.done(w)

    asyncio.run(go())
    assert not low1.kv.resident and low2.kv.resident and mid.kv.resident  # the lowest bid moved, only it
    _finish(market, low1, low2, mid, w)


def test_holders_pay_at_most_their_bid_in_rent():
    market, _ = _market(pages=8, host=8)
    cheap, dear = _holder(market, "cheap", bid=0.5, tokens=8), _holder(market, "dear", bid=6.0, tokens=8)
    other = market.ledger.join("other", "other")  # the only endowment: every dividend goes there
    cheap.wallet.endowment = dear.wallet.endowment = 0.0
    market.price, market._contended = 2.0, True  # as left by an auction since the last tick
    before = (cheap.wallet.balance, dear.wallet.balance, other.balance)
    market.tick(0.01)
    assert before[0] - cheap.wallet.balance == pytest.approx(0.5 * 2)  # its bid, below the price
    assert before[1] - dear.wallet.balance == pytest.approx(2.0 * 2)  # the price, below its bid
    assert other.balance - before[2] == pytest.approx(5.0) and cheap.rent == 2.0
    market.tick(0.01)  # no auction since: no rent
    assert other.balance - before[2] == pytest.approx(5.0)
    _finish(market, cheap, dear)


def test_a_restore_that_cannot_get_its_pages_changes_nothing():
    market, _ = _market(pages=8, host=0)
    a = _holder(market, "a", tokens=16)
    market.park(a)  # dropped: its four committed pages stay idle in the prefix cache
    b = _holder(market, "b", tokens=28)  # takes the 4 free pages and evicts 3 cached ones
    refs = market.pool.refs_of(np.arange(8)).copy()
    with pytest.raises(OutOfPages):
        a.kv.restore()
    assert (market.pool.refs_of(np.arange(8)) == refs).all() and not a.kv.resident
    _finish(market, a, b)


def test_admission_returns_what_it_granted():
    market, _ = _market(pages=8, host=8)
    a = _holder(market, "a", tokens=6)

    async def go():
        grant = await market.admit(a, 2)
        market.done(a)
        return grant

    grant = asyncio.run(go())
    assert (grant.pages, grant.replay_from) == (2, None) and len(a.kv.pages) == 4
    _finish(market, a)


def test_a_suspended_waiter_waits_for_the_pages_its_restore_takes():
    market, _ = _market(pages=8, host=8)
    a = _holder(market, "a", bid=1.0, tokens=12)
    market.park(a)  # 3 pages to the host; its cached copies are evicted by b
    b = _holder(market, "b", bid=5.0, tokens=32)
    assert market.pool.free_count == 0 and not a.kv.resident

    async def go():
        task = asyncio.create_task(market.admit(a, 0))  # a's next pass: no new page, 3 to restore
        await asyncio.sleep(0.01)
        assert not task.done() and a in market.waiters  # outbid and short: waits, neither granted nor failed
        b.kv.release()
        market.leave(b.kv)
        await task
        market.done(a)

    asyncio.run(go())
    assert a.kv.resident
    _finish(market, a)


def test_a_context_that_asked_for_no_pass_lately_gives_its_pages_up_first():
    from pie_core.scheduler.market import QUIET_TICKS

    market, copies = _market(pages=8, host=8)
    talker, waiting = _holder(market, "talker", tokens=16), _holder(market, "waiting", tokens=16)
    talker.override, waiting.override = 1.0, 5.0  # the one waiting on its tool bids more, by its balance
    for _ in range(QUIET_TICKS):
        assert market.reserve_now(talker, 0)  # a decode step within its last page: no new page
        market.tick(0.01)
    assert waiting.bid() == 0.0 and talker.bid() == 1.0
    newcomer = _holder(market, "newcomer", bid=3.0)

    async def go():
        await market.admit(newcomer, 4)
        market.done(newcomer)

    asyncio.run(go())
    assert not waiting.kv.resident and talker.kv.resident and len(newcomer.kv.pages) == 4
    waiting.override = 5.0

    async def back():  # its next pass brings it back, bidding again
        await market.admit(waiting, 0)
        market.done(waiting)

    waiting.quiet = QUIET_TICKS
    assert market.pool.available_count == 0
    newcomer.kv.release()
    market.leave(newcomer.kv)
    asyncio.run(back())
    assert waiting.kv.resident and waiting.quiet == 0
    _finish(market, talker, waiting)


def test_a_waiter_never_counts_as_quiet():
    from pie_core.scheduler.market import QUIET_TICKS

    market, _ = _market(pages=8, host=0)
    holder = _holder(market, "h", bid=2.0, tokens=16)
    holder.wanted = 4  # as while its pass waits in admit
    for _ in range(QUIET_TICKS + 2):
        market.tick(0.01)
    assert holder.quiet == 0 and holder.bid() == 2.0
    holder.wanted = -1
    _finish(market, holder)
