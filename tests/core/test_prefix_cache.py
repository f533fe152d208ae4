"""Prefix sharing: full pages are found by a content hash chained over tokens and positions."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pie_core.errors import OutOfPages
from pie_core.kv.context import KvContext
from pie_core.kv.pool import PagePool

PS = 4


def _run(ctx: KvContext, tokens: list[int], positions: list[int] | None = None, masked: bool = False) -> int:
    """What the host does for a pass: adopt cached pages, then write (plan + advance) the rest."""
    ids = np.asarray(tokens, dtype=np.int32)
    pos = np.asarray(positions if positions is not None else range(ctx.length, ctx.length + len(tokens)), dtype=np.int32)
    done = 0 if masked else ctx.adopt_prefix(ids, pos, len(ids))
    if done < len(ids):
        ctx.plan_write(len(ids) - done)
        ctx.advance(ids[done:].tolist(), pos[done:].tolist(), masks=np.ones((len(ids) - done, ctx.length + len(ids) - done), bool) if masked else None)
    return done


def test_second_context_with_same_prompt_takes_cached_pages():
    pool = PagePool(16, PS)
    a, b = KvContext(pool), KvContext(pool)
    prompt = list(range(100, 110))  # two full pages + 2 tokens
    assert _run(a, prompt) == 0
    assert _run(b, prompt) == 8  # the two full pages came from the cache, only the tail ran
    assert a.pages[:2] == b.pages[:2] and a.pages[2] != b.pages[2]
    assert pool.used_count == 4  # 2 shared + 2 private tail pages
    a.release(), b.release()
    assert pool.is_whole() and len(pool.cache) == 2


def test_equal_pages_computed_at_once_are_deduplicated_on_commit():
    pool = PagePool(16, PS)
    a, b = KvContext(pool), KvContext(pool)
    for ctx in (a, b):  # both write before either commits: nothing to adopt yet
        ctx.plan_write(8)
    for ctx in (a, b):
        ctx.advance(list(range(8)), list(range(8)))
    assert a.pages == b.pages and pool.used_count == 2
    assert [pool.refcount(p) for p in a.pages] == [3, 3]  # a, b and the prefix cache
    a.release(), b.release()
    assert pool.is_whole()


def test_different_positions_or_earlier_tokens_do_not_share():
    pool = PagePool(16, PS)
    a, b, c = KvContext(pool), KvContext(pool), KvContext(pool)
    _run(a, [1, 2, 3, 4, 5, 6, 7, 8])
    assert _run(b, [1, 2, 3, 4, 5, 6, 7, 8], positions=[10, 11, 12, 13, 14, 15, 16, 17]) == 0
    assert _run(c, [9, 2, 3, 4, 5, 6, 7, 8]) == 0  # page 2 equal, but its prefix differs
    assert len({a.pages[1], b.pages[1], c.pages[1]}) == 3
    for ctx in (a, b, c):
        ctx.release()
    assert pool.is_whole()


def test_pages_written_under_a_custom_mask_are_not_shared():
    pool = PagePool(16, PS)
    a, b = KvContext(pool), KvContext(pool)
    _run(a, [1, 2, 3, 4], masked=True)
    _run(a, [5, 6, 7, 8])
    assert not a.shareable and len(pool.cache) == 0
    assert _run(b, [1, 2, 3, 4, 5, 6, 7, 8]) == 0
    a.release(), b.release()
    assert pool.is_whole()


def test_adoption_stops_before_rows_that_must_run():
    pool = PagePool(16, PS)
    a, b = KvContext(pool), KvContext(pool)
    prompt = list(range(12))
    _run(a, prompt)
    ids, pos = np.asarray(prompt), np.arange(12)
    assert b.adopt_prefix(ids, pos, limit=5) == 4  # row 5 is sampled: only page 0 is taken
    assert b.length == 4 and b.committed == 1
    a.release(), b.release()
    assert pool.is_whole()


def test_forks_continue_the_hash_chain():
    pool = PagePool(16, PS)
    a = KvContext(pool)
    _run(a, [1, 2, 3, 4, 5, 6])
    child, _, _ = a.fork()
    _run(child, [7, 8])  # completes page 2 of the chain [1..8]
    fresh = KvContext(pool)
    assert _run(fresh, [1, 2, 3, 4, 5, 6, 7, 8]) == 8
    for ctx in (a, child, fresh):
        ctx.release()
    assert pool.is_whole()


def test_idle_cached_pages_are_evicted_when_the_pool_runs_short():
    pool = PagePool(4, PS)
    a = KvContext(pool)
    _run(a, list(range(16)))  # four committed pages, all cached
    a.release()
    assert pool.free_count == 0 and pool.available_count == 4 and pool.is_whole()
    b = KvContext(pool)
    _run(b, [99] * 8)  # needs two pages: the two deepest cached pages go first
    c = KvContext(pool)
    assert _run(c, list(range(8))) == 8  # the root of the old chain is still cached
    b.release(), c.release()
    assert pool.is_whole()


def test_cached_pages_in_use_are_never_evicted():
    pool = PagePool(3, PS)
    a = KvContext(pool)
    _run(a, list(range(8)))  # holds 2 pages (cached too)
    b = KvContext(pool)
    b.reserve(1)
    with pytest.raises(OutOfPages, match="needs 1 KV pages"):
        b.reserve(1)
    assert pool.refcount(a.pages[0]) == 2 and len(pool.cache) == 2
    a.release(), b.release()
    assert pool.is_whole()


def _assert_refcounts_exact(pool: PagePool, live: list[KvContext]) -> None:
    """Each page's count is its holders: every live context listing it, plus the prefix cache."""
    holders = [p for c in live for p in c.pages] + pool.cache.pages()
    for page in range(pool.num_pages):
        assert pool.refcount(page) == holders.count(page), f"page {page}"
    assert pool.free_count == pool.num_pages - len(set(holders))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 11), st.booleans()), min_size=1, max_size=25))
def test_any_sequence_of_shared_prompts_leaves_the_pool_whole(ops):
    pool = PagePool(24, PS)
    live: list[KvContext] = []
    for vocab_seed, n, release in ops:
        ctx = KvContext(pool)
        tokens = [(vocab_seed * 7 + i) % 5 for i in range(n)]
        available = pool.available_count
        try:
            _run(ctx, tokens)
        except OutOfPages:  # the only failure allowed, and only when the pool really is short
            assert available < -(-n // PS)
            ctx.release()
            _assert_refcounts_exact(pool, live)
            continue
        if release:
            ctx.release()
        else:
            live.append(ctx)
        _assert_refcounts_exact(pool, live)
    for ctx in live:
        ctx.release()
    assert pool.is_whole()


def test_chain_keys_hash_each_full_page_on_the_one_before():
    from pie_core.kv.prefix_cache import ROOT, chain_hash, chain_keys, salted_root

    tokens, positions = np.arange(100, 108, dtype=np.int32), np.arange(8, dtype=np.int32)
    first = chain_hash(ROOT, tokens[:4], positions[:4])
    assert chain_keys(ROOT, tokens, positions, PS) == [first, chain_hash(first, tokens[4:], positions[4:])]
    assert chain_keys(ROOT, tokens[:0], positions[:0], PS) == []
    assert salted_root(b"") == ROOT and salted_root(b"lora") not in (ROOT, salted_root(b"lorb"))
