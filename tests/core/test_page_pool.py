import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pie_core.errors import OutOfPages
from pie_core.kv.pool import PagePool


def test_alloc_hands_out_distinct_pages_and_release_returns_them():
    pool = PagePool(8, 4)
    a = pool.alloc(3)
    b = pool.alloc(5)
    assert len(set(a + b)) == 8 and pool.free_count == 0
    pool.release(a + b)
    assert pool.is_whole()


def test_alloc_beyond_free_raises_and_takes_nothing():
    pool = PagePool(4, 4)
    held = pool.alloc(3)
    with pytest.raises(OutOfPages, match="needs 2 KV pages but only 1 of 4"):
        pool.alloc(2)
    assert pool.free_count == 1
    pool.release(held)
    assert pool.is_whole()


def test_shared_page_frees_only_when_last_holder_releases():
    pool = PagePool(2, 4)
    [p] = pool.alloc(1)
    pool.retain([p])
    pool.release([p])
    assert pool.refcount(p) == 1 and not pool.is_whole()
    pool.release([p])
    assert pool.is_whole()


def test_double_release_is_an_error():
    pool = PagePool(2, 4)
    pages = pool.alloc(1)
    pool.release(pages)
    with pytest.raises(RuntimeError, match="release of free pages"):
        pool.release(pages)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "retain", "release"]), st.integers(0, 5)), max_size=60))
def test_pool_accounting_never_leaks(ops):
    pool = PagePool(16, 4)
    holders: list[int] = []  # one entry per reference held
    for op, n in ops:
        if op == "alloc":
            try:
                holders += pool.alloc(n)
            except OutOfPages:
                assert n > pool.free_count
        elif op == "retain" and holders:
            page = holders[n % len(holders)]
            pool.retain([page])
            holders.append(page)
        elif op == "release" and holders:
            pool.release([holders.pop(n % len(holders))])
        assert pool.free_count + len(set(holders)) == pool.num_pages
        for page in set(holders):
            assert pool.refcount(page) == holders.count(page)
    pool.release(holders)
    assert pool.is_whole()


def test_can_take_counts_free_pages_and_pages_only_the_prefix_cache_holds():
    pool = PagePool(4, 2)
    held = pool.alloc(3)
    pool.cache.insert_chain([b"k0", b"k1"], held[:2])  # the cache holds them too
    assert pool.can_take(1) and not pool.can_take(2)
    pool.release(held)  # held[:2] are left to the cache alone: idle, available
    assert pool.free_count == 2 and pool.can_take(4) and not pool.can_take(5)
    pool.alloc(4)  # takes the free pages, then evicts the idle ones
    assert not pool.can_take(1)
