from inferlet import Context, Model, Sampler, runtime


def _model() -> Model:
    return Model.load(runtime.models()[0])


def test_fork_shares_committed_pages_and_copies_the_working_page(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append(list(range(100, 140)))
            await ctx.flush()
            raw = ctx.inner()
            committed, page_size = raw.committed_page_count(), ctx.page_size
            pool = dummy.engine.models[dummy.model].pool
            before = pool.used_count
            forks = [ctx.fork() for _ in range(8)]
            after = pool.used_count
            seq = [f.seq_len for f in forks]
            for f in forks:
                f.release()
            return committed, page_size, before, after, seq

    committed, page_size, before, after, seq = dummy.value(main)
    assert committed == 40 // page_size
    working = 1 if 40 % page_size else 0
    assert after - before == 8 * working  # committed pages are held once, shared by refcount
    assert seq == [40] * 8


def test_fork_keeps_buffer_and_continues_independently(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hello")
            child = ctx.fork()
            assert child.buffer() == ctx.buffer()
            a = await ctx.generate(Sampler.argmax(), max_tokens=4, stop=[]).collect_tokens()
            b = await child.generate(Sampler.argmax(), max_tokens=4, stop=[]).collect_tokens()
            child.release()
            return a, b

    a, b = dummy.value(main)
    assert a == b


def test_snapshot_outlives_the_inferlet_and_open_take_delete(dummy):
    async def saver(_):
        ctx = Context(_model())
        ctx.user("remember me")
        await ctx.flush()
        ctx.save("memo")
        return ctx.seq_len, ctx.snapshot()

    seq_len, auto_name = dummy.value(saver)
    assert auto_name.startswith("snap-")

    async def reader(_):
        model = _model()
        opened = Context.open(model, "memo")
        taken = Context.take(model, "memo")
        again = Context.take(model, "memo")
        missing = Context.open(model, "never-saved")
        Context.delete(model, auto_name)
        result = (opened.seq_len, taken.seq_len, again, missing, Context.open(model, auto_name))
        opened.release()
        taken.release()
        return result

    opened, taken, again, missing, deleted = dummy.value(reader)
    assert opened == taken == seq_len
    assert again is None and missing is None and deleted is None


def test_snapshots_are_per_user(dummy):
    import asyncio

    from pie_core.runtime.instance import run_main

    async def save(_):
        ctx = Context(_model())
        ctx.append([1, 2, 3])
        await ctx.flush()
        ctx.save("mine")
        ctx.release()

    async def peek(_):
        found = Context.open(_model(), "mine")
        return found is not None

    async def go():
        await run_main(dummy.engine, save, {}, lambda e: None, username="alice")
        bob = await run_main(dummy.engine, peek, {}, lambda e: None, username="bob")
        alice = await run_main(dummy.engine, peek, {}, lambda e: None, username="alice")
        return bob.value, alice.value

    assert asyncio.run(go()) == (False, True)
    dummy.engine.snapshots.clear()


def test_raw_page_operations(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            raw = ctx.inner()
            raw.reserve_working_pages(3)
            reserved = raw.working_page_count()
            ctx.append([5] * (ctx.page_size + 2))
            await ctx.flush()
            counts = (raw.committed_page_count(), raw.working_page_count(), raw.working_page_token_count())
            raw.truncate_working_page_tokens(2)
            raw.release_working_pages(raw.working_page_count())
            return reserved, counts, raw.working_page_count(), ctx.seq_len, ctx.page_size

    reserved, counts, left, seq_len, page_size = dummy.value(main)
    assert reserved == 3
    assert counts == (1, 2, 2)
    assert left == 0 and seq_len == page_size
