"""Edges of the page pool, the prefix cache and forks: which pages a fork copies (source and
destination), allocation at exactly the available count, eviction that must skip pages in use,
and prefix adoption beside working or reserved pages. Refcounts are checked exactly."""

import numpy as np
import pytest

from pie_core.errors import OutOfPages
from pie_core.kv.context import KvContext
from pie_core.kv.pool import PagePool

PS = 4


def _write(ctx: KvContext, tokens: list[int], hold: int = 0) -> None:
    ctx.plan_write(len(tokens))
    ctx.advance(tokens, list(range(ctx.length, ctx.length + len(tokens))), hold=hold)


def _cached(pool: PagePool, ctx: KvContext, tokens: list[int]) -> list[int]:
    """Commit ``tokens`` (whole pages) into the cache through ``ctx``; the pages they went to."""
    _write(ctx, tokens)
    return ctx.pages[: len(tokens) // PS]


def test_fork_copies_the_partial_working_page_into_a_fresh_page_and_shares_the_rest():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, list(range(10)))  # pages 0, 1 committed; page 2 holds 2 tokens
    ctx.reserve(2)  # empty working pages are not copied
    committed, partial, reserved = ctx.pages[:2], ctx.pages[2], ctx.pages[3:]
    child, src, dst = ctx.fork()
    assert src == [partial] and dst == [5]  # the lowest free page
    assert child.pages == committed + dst and ctx.pages == committed + [partial] + reserved
    assert [pool.refcount(p) for p in committed] == [3, 3]  # parent, child, prefix cache
    assert pool.refcount(partial) == 1 and pool.refcount(dst[0]) == 1
    assert (child.length, child.committed, child.tokens) == (10, 2, ctx.tokens)
    child.release()
    assert [pool.refcount(p) for p in committed] == [2, 2] and pool.refcount(dst[0]) == 0
    ctx.release()
    assert pool.is_whole()


def test_fork_copies_full_working_pages_of_held_drafts_in_order():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, [1, 2, 3])
    _write(ctx, [4, 5, 6, 7, 8, 9, 10, 11, 12], hold=9)  # drafts from slot 3 on: no page is settled
    assert ctx.committed == 0 and len(ctx.pages) == 3
    child, src, dst = ctx.fork()
    assert src == ctx.pages and dst == [3, 4, 5] and child.pages == dst
    child.release(), ctx.release()
    assert pool.is_whole()


def test_fork_on_a_page_boundary_copies_nothing():
    pool = PagePool(8, PS)
    ctx = KvContext(pool)
    _write(ctx, list(range(8)))
    child, src, dst = ctx.fork()
    assert src == dst == [] and child.pages == ctx.pages
    assert [pool.refcount(p) for p in ctx.pages] == [3, 3]
    child.release(), ctx.release()
    assert pool.is_whole()


def test_allocating_exactly_the_available_pages_evicts_every_idle_cached_page():
    pool = PagePool(4, PS)
    ctx = KvContext(pool)
    cached = _cached(pool, ctx, list(range(8)))
    ctx.release()
    assert (pool.free_count, pool.available_count, len(pool.cache)) == (2, 4, 2)
    pages = pool.alloc(4)
    assert sorted(pages) == [0, 1, 2, 3] and set(cached) <= set(pages)
    assert len(pool.cache) == 0 and pool.free_count == 0
    assert all(pool.refcount(p) == 1 for p in pages)
    pool.release(pages)
    assert pool.is_whole()


def test_allocating_one_page_more_than_available_takes_nothing_and_keeps_the_cache():
    pool = PagePool(4, PS)
    ctx = KvContext(pool)
    cached = _cached(pool, ctx, list(range(8)))
    ctx.release()
    with pytest.raises(OutOfPages, match="needs 5 KV pages"):
        pool.alloc(5)
    assert sorted(pool.cache.pages()) == sorted(cached)
    assert (pool.free_count, len(pool.cache)) == (2, 2)
    assert [pool.refcount(p) for p in cached] == [1, 1]


def test_eviction_takes_idle_pages_and_skips_older_cached_pages_in_use():
    pool = PagePool(4, PS)
    user = KvContext(pool)
    in_use = _cached(pool, user, list(range(8)))  # cached first: least recently used
    gone = KvContext(pool)
    idle = _cached(pool, gone, list(range(20, 28)))
    gone.release()
    assert pool.free_count == 0 and pool.available_count == 2
    pages = pool.alloc(2)
    assert sorted(pages) == sorted(idle)
    assert sorted(pool.cache.pages()) == sorted(in_use) and [pool.refcount(p) for p in in_use] == [2, 2]
    pool.release(pages), user.release()
    assert pool.is_whole()


def test_when_every_cached_page_is_held_nothing_can_be_evicted():
    pool = PagePool(4, PS)
    ctx = KvContext(pool)
    held = _cached(pool, ctx, list(range(16)))
    assert pool.available_count == 0
    with pytest.raises(OutOfPages):
        pool.alloc(1)
    assert sorted(pool.cache.pages()) == sorted(held) and all(pool.refcount(p) == 2 for p in held)
    ctx.release()
    assert pool.is_whole() and pool.available_count == 4


def test_retaining_a_free_page_is_refused_and_changes_nothing():
    pool = PagePool(4, PS)
    [held] = pool.alloc(1)
    with pytest.raises(RuntimeError, match=r"retain of free pages \[1\]"):
        pool.retain([held, 1])
    assert pool.refcount(held) == 1 and pool.refcount(1) == 0 and pool.free_count == 3
    pool.release([held])
    assert pool.is_whole()


def test_adoption_is_refused_while_the_context_holds_working_tokens():
    pool = PagePool(16, PS)
    donor = KvContext(pool)
    donor.plan_write(12)
    donor.advance(list(range(2, 14)), list(range(2, 14)))  # cached: pages of tokens 2..13 at positions 2..13
    ctx = KvContext(pool)
    _write(ctx, [0, 1])  # slots 0, 1 sit in a working page: cached pages cannot follow them
    before = (list(ctx.pages), ctx.length, pool.cache.hits, [pool.refcount(p) for p in donor.pages])
    ids = np.arange(2, 14, dtype=np.int32)
    assert ctx.adopt_prefix(ids, ids, len(ids)) == 0
    assert (list(ctx.pages), ctx.length, pool.cache.hits, [pool.refcount(p) for p in donor.pages]) == before
    ctx.release(), donor.release()
    assert pool.is_whole()


def test_adopted_pages_go_before_reserved_working_pages_and_the_next_write_lands_after_them():
    pool = PagePool(16, PS)
    donor = KvContext(pool)
    _write(donor, list(range(12)))
    ctx = KvContext(pool)
    ctx.reserve(2)
    reserved = list(ctx.pages)
    ids = np.arange(12, dtype=np.int32)
    assert ctx.adopt_prefix(ids, ids, 12) == 12
    assert ctx.pages == donor.pages[:3] + reserved and ctx.committed == 3
    assert [pool.refcount(p) for p in donor.pages[:3]] == [3, 3, 3]  # donor, ctx, cache
    plan = ctx.plan_write(2)
    assert plan.page_ids.tolist() == donor.pages[:3] + reserved[:1] and plan.write_slots.tolist() == [12, 13]
    ctx.release(), donor.release()
    assert pool.is_whole()


def test_adoption_continues_the_chain_of_a_context_with_committed_pages():
    pool = PagePool(16, PS)
    donor = KvContext(pool)
    _write(donor, list(range(16)))
    ctx = KvContext(pool)
    ids = np.arange(16, dtype=np.int32)
    assert ctx.adopt_prefix(ids[:4], ids[:4], 4) == 4  # page 0 first
    assert ctx.adopt_prefix(ids[4:], ids[4:], 12) == 12  # then pages 1..3, keyed after page 0
    assert ctx.pages == donor.pages and ctx.length == 16 and ctx.tokens == list(range(16))
    ctx.release(), donor.release()
    assert pool.is_whole()
