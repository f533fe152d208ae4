"""Reference section "Context", call by call: construction and lifecycle, filling, inspection,
truncate (forks and snapshots have their own file, test_forks_and_snapshots.py)."""

from __future__ import annotations

import gc

import pytest

from inferlet import Context, Model, chat, runtime
from pie_core.errors import InvalidInput, PieError


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _held(dummy) -> int:
    """Pages someone holds (pages only the prefix cache keeps count as available)."""
    pool = dummy.engine.models[dummy.model].pool
    return pool.num_pages - pool.available_count


def test_a_new_context_is_empty_and_bound_to_its_model(dummy):
    async def main(_):
        model = _model()
        ctx = Context(model)
        return ctx.model == model, ctx.seq_len, ctx.buffer(), ctx.page_size

    same_model, seq_len, buffer, page_size = dummy.value(main)
    assert same_model and seq_len == 0 and buffer == []
    assert page_size == dummy.engine.models[dummy.model].caps.page_size


def test_pages_are_released_when_the_context_is_dropped(dummy):
    async def main(_):
        ctx = Context(_model())
        ctx.append(list(range(1, 41)))
        await ctx.flush()
        held = _held(dummy)
        del ctx
        gc.collect()
        return held, _held(dummy)

    held, after = dummy.value(main)
    assert held >= 3 and after == held - 3  # 40 tokens in 16-token pages, freed on drop


def test_release_frees_pages_now_and_the_context_refuses_further_use(dummy):
    async def main(_):
        ctx = Context(_model())
        ctx.append([1, 2, 3])
        await ctx.flush()
        held = _held(dummy)
        ctx.release()
        freed = _held(dummy)
        ctx.release()  # idempotent
        with pytest.raises(PieError, match="released"):
            ctx.append([4])
        with pytest.raises(PieError, match="released"):
            await ctx.flush()
        with pytest.raises(PieError, match="released"):
            ctx.forward()
        with pytest.raises(PieError, match="released"):
            ctx.fork()
        for read in (lambda: ctx.seq_len, lambda: ctx.page_size, lambda: ctx.inner().committed_page_count(),
                     lambda: ctx.inner().working_page_count(), lambda: ctx.inner().working_page_token_count()):
            with pytest.raises(PieError, match="released"):  # the host checks: no stale numbers
                read()
        return held, freed

    held, freed = dummy.value(main)
    assert freed == held - 1


def test_with_block_releases_the_context(dummy):
    async def main(_):
        before = _held(dummy)
        with Context(_model()) as ctx:
            ctx.append([1, 2, 3])
            await ctx.flush()
            inside = _held(dummy)
        after = _held(dummy)
        async with Context(_model()) as actx:
            actx.append([1])
            await actx.flush()
        return before, inside, after, _held(dummy)

    before, inside, after, after_async = dummy.value(main)
    assert inside == before + 1 and after == after_async == before


def test_chat_fillers_chain_and_add_the_formats_tokens_to_the_buffer(dummy):
    async def main(_):
        model = _model()
        with Context(model) as ctx:
            chained = ctx.system("S").user("U").assistant("A").user("U2").cue()
            before_seal = ctx.buffer()
            sealed = ctx.seal() is ctx
            expected = (
                chat.system(model, "S") + chat.user(model, "U") + chat.assistant(model, "A")
                + chat.user(model, "U2") + chat.cue(model)
            )
            return chained is ctx, sealed, before_seal, expected, ctx.buffer(), chat.seal(model), ctx.seq_len

    chained, sealed, before_seal, expected, after_seal, seal, seq_len = dummy.value(main)
    assert chained and sealed and before_seal == expected
    assert after_seal == expected + seal
    assert seq_len == 0  # filling only buffers; nothing ran


def test_append_fill_and_fill_tokens_buffer_raw_tokens(dummy):
    async def main(_):
        model = _model()
        with Context(model) as ctx:
            same = ctx.append([5, 6]).fill("hello world").fill_tokens([7]) is ctx
            return same, ctx.buffer(), model.tokenizer().encode("hello world")

    same, buffer, hello = dummy.value(main)
    assert same and buffer == [5, 6, *hello, 7]


def test_flush_runs_the_buffer_and_commits_full_pages(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append(list(range(10, 30)))  # 20 tokens: one full 16-token page and 4 more
            await ctx.flush()
            raw = ctx.inner()
            state = ctx.seq_len, ctx.buffer(), raw.committed_page_count(), raw.working_page_token_count()
            await ctx.flush()  # nothing buffered: a no-op
            return state, ctx.seq_len

    (seq_len, buffer, committed, working_tokens), again = dummy.value(main)
    assert seq_len == again == 20 and buffer == []
    assert committed == 1 and working_tokens == 4


def test_seq_len_excludes_the_buffer_and_buffer_returns_a_copy(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append([1, 2, 3])
            await ctx.flush()
            ctx.append([4, 5])
            copy = ctx.buffer()
            copy.append(99)
            return ctx.seq_len, ctx.buffer()

    assert dummy.value(main) == (3, [4, 5])


def test_truncate_drops_trailing_working_tokens_only(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append(list(range(1, 21)))  # one committed page + 4 working tokens
            await ctx.flush()
            ctx.truncate(3)
            after = ctx.seq_len
            with pytest.raises(InvalidInput):
                ctx.truncate(2)  # only one working token is left; committed pages stay
            return after, ctx.seq_len, ctx.inner().committed_page_count()

    assert dummy.value(main) == (17, 17, 1)


def test_truncated_tokens_are_forgotten_by_the_next_pass(dummy):
    """After truncating, the next tokens land where the dropped ones were: generating from a
    truncated context equals generating from one that never held them."""

    async def main(_):
        from inferlet import Sampler

        model = _model()
        with Context(model) as a, Context(model) as b:
            a.append([1, 2, 3, 4, 5])
            await a.flush()
            a.truncate(2)
            a.append([9])
            b.append([1, 2, 3, 9])
            ga = await a.generate(Sampler.argmax(), max_tokens=4, stop=[], auto_flush=False).collect_tokens()
            gb = await b.generate(Sampler.argmax(), max_tokens=4, stop=[], auto_flush=False).collect_tokens()
            return ga, gb

    ga, gb = dummy.value(main)
    assert ga == gb
