import numpy as np
import pytest

from pie_core.errors import InvalidInput, OutOfPages, PieError
from pie_core.kv.context import KvContext
from pie_core.kv.pool import PagePool


def _write(ctx: KvContext, n: int):
    plan = ctx.plan_write(n)
    ctx.advance(list(range(n)), list(range(ctx.length, ctx.length + n)))
    return plan


def test_plan_write_reserves_pages_and_names_next_slots():
    pool = PagePool(8, 4)
    ctx = KvContext(pool)
    plan = _write(ctx, 6)
    assert len(plan.page_ids) == 2 and plan.last_page_len == 2
    assert plan.write_slots.tolist() == list(range(6))
    plan = ctx.plan_write(3)
    assert plan.write_slots.tolist() == [6, 7, 8] and len(plan.page_ids) == 3 and plan.last_page_len == 1
    ctx.release()
    assert pool.is_whole()


def test_full_pages_commit_and_truncate_stops_at_committed():
    pool = PagePool(8, 4)
    ctx = KvContext(pool)
    _write(ctx, 10)
    assert ctx.committed == 2 and ctx.working_tokens == 2
    with pytest.raises(InvalidInput, match="committed pages cannot be truncated"):
        ctx.truncate(3)
    ctx.truncate(2)
    assert ctx.length == 8 and len(ctx.pages) == 2 and pool.used_count == 2
    ctx.release()
    assert pool.is_whole()


def test_out_of_pages_leaves_context_unchanged():
    pool = PagePool(2, 4)
    ctx = KvContext(pool)
    _write(ctx, 5)
    with pytest.raises(OutOfPages):
        ctx.plan_write(8)
    assert len(ctx.pages) == 2 and ctx.length == 5
    ctx.release()
    assert pool.is_whole()


def test_released_context_refuses_work():
    pool = PagePool(2, 4)
    ctx = KvContext(pool)
    ctx.release()
    ctx.release()  # idempotent
    with pytest.raises(PieError, match="released"):
        ctx.plan_write(1)
    assert pool.is_whole()


def test_reserve_and_release_working_pages():
    pool = PagePool(8, 4)
    ctx = KvContext(pool)
    ctx.reserve(3)
    assert ctx.working_pages == 3
    _write(ctx, 5)
    assert len(ctx.pages) == 3  # reused the reserved pages
    with pytest.raises(InvalidInput, match="only 1 working pages are empty"):
        ctx.release_working(2)
    ctx.release_working(1)
    assert np.array_equal(ctx.plan_write(0).page_ids, ctx.pages[:2])
    ctx.release()
    assert pool.is_whole()


def test_a_pool_that_runs_out_charges_the_account_nothing():
    pool = PagePool(4, 4)
    pool.accounts.limit_of = lambda user: 100  # the quota allows it; the pool does not
    account = pool.accounts.of("alice")
    ctx = KvContext(pool, account)
    ctx.reserve(3)
    with pytest.raises(OutOfPages):
        ctx.reserve(2)
    ctx.reserve(1)
    _write(ctx, 3)
    with pytest.raises(OutOfPages):
        ctx.fork()  # its partly written page needs a copy; no page is free
    assert account.held == 4
    ctx.release()
    assert account.held == 0 and pool.free_count == 4


def test_held_drafts_stay_working_until_settled_and_rejected_ones_free_their_pages():
    pool = PagePool(8, 4)
    ctx = KvContext(pool)
    _write(ctx, 3)
    ctx.plan_write(7)  # 2 inputs + 5 drafts: slots 3..9, pages 0..2
    ctx.advance([7, 8, 1, 2, 3, 4, 5], list(range(3, 10)), hold=5)
    assert ctx.committed == 1  # slots 0..4 hold no draft: page 0 full of kept tokens only
    ctx.settle(4)  # one draft kept: slots 0..5
    assert ctx.length == 6 and ctx.tokens == [0, 1, 2, 7, 8, 1] and ctx.committed == 1
    assert len(ctx.pages) == 2 and pool.used_count == 2  # page 2 held only rejected drafts
    ctx.plan_write(2)
    ctx.advance([9, 9], [6, 7], hold=2)
    assert ctx.committed == 1  # page 1 is full, but of drafts still unverified
    ctx.settle(0)
    assert ctx.committed == 2 and ctx.length == 8
    ctx.release()
    assert pool.is_whole()
