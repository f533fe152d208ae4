"""What a context answers about its pages, so that the scheduler and the market never do its
arithmetic: pages a pass needs, pages held (or taken back on restore), spare pages, what a fork
copies, and the passes of a replay."""

import numpy as np

from pie_core.kv.context import KvContext
from pie_core.kv.host_pool import HostPool
from pie_core.kv.pool import PagePool

PS = 4


def _write(ctx: KvContext, n: int, hold: int = 0, masks=None) -> None:
    base = 100 * (ctx.length + 1)  # distinct tokens: no page is found in the prefix cache
    ctx.plan_write(n)
    ctx.advance(list(range(base, base + n)), list(range(ctx.length, ctx.length + n)), masks, hold)


def test_a_pass_needs_a_page_per_page_size_tokens_past_the_pages_held():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    assert [ctx.pages_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    _write(ctx, 6)  # two pages, the second half full
    assert [ctx.pages_needed(n) for n in (0, 1, 2, 3, 6, 7)] == [0, 0, 0, 1, 1, 2]
    ctx.release()
    assert pool.is_whole()


def test_pages_needed_counts_from_the_slot_a_pass_writes_at():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 6)
    assert ctx.pages_needed(1, at=7) == 0  # slot 7 is the last of page 1
    assert ctx.pages_needed(1, at=8) == 1
    assert ctx.pages_needed(2, at=7) == 1
    assert ctx.pages_needed(1, at=0) == 0
    ctx.release()


def test_reserved_pages_count_as_held():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 6)
    ctx.reserve(2)  # pages for slots up to 15
    assert ctx.held_pages == 4 and ctx.pages_needed(10) == 0 and ctx.pages_needed(11) == 1
    ctx.release()
    assert pool.is_whole()


def test_plan_write_reserves_exactly_the_pages_needed():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 6)
    need = ctx.pages_needed(7)
    ctx.plan_write(7)
    assert need == 2 and len(ctx.pages) == 4 and ctx.pages_needed(7) == 0
    ctx.release()
    assert pool.is_whole()


def test_a_suspended_context_holds_the_pages_it_takes_back_on_restore():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 6)
    ctx.reserve(2)
    ctx.drop()  # its spare pages go first
    assert not ctx.resident and ctx.pages == [] and ctx.held_pages == 2
    assert ctx.pages_needed(2) == 0 and ctx.pages_needed(3) == 1
    ctx.restore()
    assert ctx.held_pages == len(ctx.pages) == 2
    ctx.release()
    assert pool.is_whole()


def test_spare_pages_are_the_empty_working_pages_reserved_ahead():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    assert ctx.spare_pages == 0
    ctx.reserve(2)
    assert ctx.spare_pages == 2
    _write(ctx, 5)  # fills page 0, starts page 1: nothing spare
    assert ctx.spare_pages == 0
    ctx.reserve(1)
    assert ctx.spare_pages == 1
    _write(ctx, 3)  # page 1 full; page 2 still empty
    assert ctx.committed == 2 and ctx.spare_pages == 1
    offloaded = ctx.offload(HostPool(8))
    assert offloaded is not None and ctx.spare_pages == 0
    ctx.release()
    assert pool.is_whole()


def test_release_spare_keeps_the_first_spare_pages_asked_for():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 5)
    ctx.reserve(3)
    ctx.release_spare(keep=1)
    assert ctx.spare_pages == 1 and len(ctx.pages) == 3 and pool.used_count == 3
    ctx.release_spare(keep=2)  # keeps more than it has: nothing goes
    assert ctx.spare_pages == 1
    ctx.release_spare()
    assert ctx.spare_pages == 0 and len(ctx.pages) == 2 and pool.used_count == 2
    ctx.release()
    ctx.release_spare()  # a released context: nothing to do, no error
    assert pool.is_whole()


def test_release_spare_leaves_a_suspended_context_alone():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 5)
    ctx.drop()
    ctx.release_spare()
    assert not ctx.resident and ctx.held_pages == 2
    ctx.release()
    assert pool.is_whole()


def test_a_fork_takes_fresh_pages_for_the_working_pages_holding_tokens():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    assert ctx.fork_pages == 0
    _write(ctx, 6)
    ctx.reserve(1)  # spare pages are not copied
    assert ctx.fork_pages == 1
    child, src, dst = ctx.fork()
    assert len(src) == len(dst) == 1
    child.release()
    _write(ctx, 2)  # on a page boundary, all committed: nothing to copy
    assert ctx.fork_pages == 0
    _write(ctx, 8, hold=6)  # drafts keep the pages holding them working
    assert ctx.committed == 2 and ctx.fork_pages == 2
    child, src, dst = ctx.fork()
    assert len(src) == len(dst) == 2
    child.release()
    ctx.drop()
    assert ctx.fork_pages == 0  # the clone of a suspended context is suspended too
    ctx.release()
    assert pool.is_whole()


def test_replay_recomputes_from_the_start_slot_in_pieces_with_their_pages():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 6)
    _write(ctx, 5)
    steps = list(ctx.replay(2, 4))
    assert [(s.run.start, s.run.stop) for s in steps] == [(2, 6), (6, 10), (10, 11)]
    tokens = np.asarray(ctx.tokens)
    for s in steps:
        assert s.token_ids.tolist() == tokens[s.run.start : s.run.stop].tolist()
        assert s.positions.tolist() == list(range(s.run.start, s.run.stop))
        assert s.plan.write_slots.tolist() == list(range(s.run.start, s.run.stop))
    assert [s.plan.page_ids.tolist() for s in steps] == [ctx.pages[:2], ctx.pages[:3], ctx.pages[:3]]
    assert [s.plan.last_page_len for s in steps] == [2, 2, 3]
    ctx.release()
    assert pool.is_whole()


def test_replay_runs_a_masked_pass_whole_with_its_mask():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 3)
    masks = np.tril(np.ones((3, 6), dtype=bool), k=3)
    masks[2, 0] = False
    _write(ctx, 3, masks=masks)
    steps = list(ctx.replay(0, 2))
    assert [(s.run.start, s.run.stop) for s in steps] == [(0, 2), (2, 3), (3, 6)]
    assert steps[0].run.mask_rows() is None and np.array_equal(steps[2].run.mask_rows(), masks)
    assert steps[2].plan.last_page_len == 2 and steps[2].plan.page_ids.tolist() == ctx.pages[:2]
    ctx.release()
    assert pool.is_whole()


def test_a_restore_takes_at_most_the_pages_it_held_and_names_where_a_replay_starts():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 10)
    assert ctx.restore_pages == 0  # resident
    ctx.drop()
    assert ctx.restore_pages == 3
    _, _, replay_from = ctx.restore()  # the two committed pages are still cached
    assert replay_from == 8 and ctx.restore_pages == 0
    ctx.replayed()
    ctx.offload(HostPool(8))
    assert ctx.restore_pages == 3
    slots, pages, replay_from = ctx.restore()  # copied back: nothing to replay
    assert replay_from is None and len(slots) == len(pages) == 1
    ctx.release()
    assert pool.is_whole()


def test_a_dropped_context_whose_pages_are_all_cached_needs_no_replay():
    pool = PagePool(16, PS)
    ctx = KvContext(pool)
    _write(ctx, 8)
    ctx.drop()
    assert ctx.restore() == ([], [], None)
    ctx.release()
    assert pool.is_whole()
