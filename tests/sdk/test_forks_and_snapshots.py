"""Forks, snapshots and raw page operations through the SDK, on the cpu backend with a tiny random
model: every continuation is checked against a fresh context's logits (see kv_oracle.py), so a
fork or snapshot that shares, copies or keeps the wrong page fails here."""

import asyncio

from kv_oracle import assert_same_logits, fresh_logits, history, logits_after, model

from inferlet import Context, Sampler
from pie_core.runtime.instance import run_main

PROMPT = list(range(100, 142))  # 42 tokens: 10 full pages of 4, then a working page holding 2


def test_fork_shares_committed_pages_and_copies_the_working_page(cpu):
    async def main(_):
        with Context(model()) as ctx:
            ctx.append(PROMPT)
            await ctx.flush()
            raw = ctx.inner()
            committed, page_size = raw.committed_page_count(), ctx.page_size
            before = cpu.pool.used_count
            forks = [ctx.fork() for _ in range(4)]
            after = cpu.pool.used_count
            seq = [f.seq_len for f in forks]
            # each fork goes its own way from the copied working page; the parent last
            got = [await logits_after(f, [7 + i]) for i, f in enumerate(forks)] + [await logits_after(ctx, [30])]
            for f in forks:
                f.release()
            want = [await fresh_logits(PROMPT + [7 + i]) for i in range(4)] + [await fresh_logits(PROMPT + [30])]
            return committed, page_size, before, after, seq, got, want

    committed, page_size, before, after, seq, got, want = cpu.value(main)
    assert page_size == 4 and committed == 10
    assert after - before == 4  # one copied working page per fork; committed pages are shared
    assert seq == [42] * 4
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same_logits(g, w, f"continuation {i}")


def test_a_fork_taken_on_a_page_boundary_continues_like_a_fresh_context(cpu):
    async def main(_):
        with Context(model()) as ctx:
            ctx.append(PROMPT[:40])
            await ctx.flush()
            child = ctx.fork()
            got = await logits_after(child, [5, 6, 7])
            child.release()
            mine = await logits_after(ctx, [8])
            return got, await fresh_logits(PROMPT[:40] + [5, 6, 7]), mine, await fresh_logits(PROMPT[:40] + [8])

    got, want, mine, mine_want = cpu.value(main)
    assert_same_logits(got, want, "child")
    assert_same_logits(mine, mine_want, "parent")


def test_fork_keeps_the_buffer_and_continues_independently(cpu):
    async def main(_):
        with Context(model()) as ctx:
            ctx.append(PROMPT[:10])
            await ctx.flush()
            ctx.append([1, 2, 3])  # buffered, not run: the fork gets its own copy
            child = ctx.fork()
            same_buffer = child.buffer() == ctx.buffer() == [1, 2, 3]
            a = await ctx.generate(Sampler.argmax(), max_tokens=3, stop=[]).collect_tokens()
            b = await child.generate(Sampler.argmax(), max_tokens=3, stop=[]).collect_tokens()
            seq_a, seq_b = history(ctx) + [9], history(child) + [10]
            after_a = await logits_after(ctx, [9])
            after_b = await logits_after(child, [10])
            child.release()
            return same_buffer, a, b, after_a, after_b, await fresh_logits(seq_a), await fresh_logits(seq_b)

    same_buffer, a, b, after_a, after_b, want_a, want_b = cpu.value(main)
    assert same_buffer and a == b  # same KV, same buffer, argmax: the same tokens
    assert_same_logits(after_a, want_a, "parent")
    assert_same_logits(after_b, want_b, "child")


def test_snapshot_outlives_the_inferlet_and_open_take_delete(cpu):
    async def saver(_):
        ctx = Context(model())
        ctx.append(PROMPT[:22])  # ends mid-page: the snapshot keeps a copy of the working page
        await ctx.flush()
        ctx.save("memo")
        return ctx.seq_len, ctx.snapshot()

    seq_len, auto_name = cpu.value(saver)
    assert auto_name.startswith("snap-")

    async def reader(_):
        m = model()
        opened = Context.open(m, "memo")
        taken = Context.take(m, "memo")
        again = Context.take(m, "memo")
        missing = Context.open(m, "never-saved")
        Context.delete(m, auto_name)
        result = (opened.seq_len, taken.seq_len, again, missing, Context.open(m, auto_name))
        continued = [await logits_after(opened, [3]), await logits_after(taken, [4])]
        opened.release()
        taken.release()
        return result, continued, [await fresh_logits(PROMPT[:22] + [t]) for t in (3, 4)]

    (opened, taken, again, missing, deleted), continued, want = cpu.value(reader)
    assert opened == taken == seq_len == 22
    assert again is None and missing is None and deleted is None
    assert_same_logits(continued[0], want[0], "opened snapshot")
    assert_same_logits(continued[1], want[1], "taken snapshot")


def test_snapshots_are_per_user(dummy):
    async def save(_):
        ctx = Context(model())
        ctx.append([1, 2, 3])
        await ctx.flush()
        ctx.save("mine")
        ctx.release()

    async def peek(_):
        found = Context.open(model(), "mine")
        return found is not None

    async def go():
        await run_main(dummy.engine, save, {}, lambda e: None, username="alice")
        bob = await run_main(dummy.engine, peek, {}, lambda e: None, username="bob")
        alice = await run_main(dummy.engine, peek, {}, lambda e: None, username="alice")
        return bob.value, alice.value

    assert asyncio.run(go()) == (False, True)
    dummy.engine.snapshots.clear()


def test_raw_page_operations(cpu):
    async def main(_):
        with Context(model()) as ctx:
            raw = ctx.inner()
            raw.reserve_working_pages(3)
            reserved = raw.working_page_count()
            ctx.append([5] * (ctx.page_size + 2))
            await ctx.flush()
            counts = (raw.committed_page_count(), raw.working_page_count(), raw.working_page_token_count())
            raw.truncate_working_page_tokens(2)
            raw.release_working_pages(raw.working_page_count())
            left, seq_len = raw.working_page_count(), ctx.seq_len
            got = await logits_after(ctx, [9, 8])
            return reserved, counts, left, seq_len, ctx.page_size, got, await fresh_logits([5] * ctx.page_size + [9, 8])

    reserved, counts, left, seq_len, page_size, got, want = cpu.value(main)
    assert reserved == 3
    assert counts == (1, 2, 2)
    assert left == 0 and seq_len == page_size
    assert_same_logits(got, want, "after truncating the working page")
