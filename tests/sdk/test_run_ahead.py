"""Run-ahead decode loops seen from the SDK: an inferlet that falls behind takes every pass the
engine ran already in one ``forward_next`` call, and what it took but never used is gone from the
context before anything else touches it (the engine holds exactly the tokens the program saw)."""

import asyncio

from inferlet import Context, Model, Sampler, runtime
from inferlet.host import context as host_context

NEXT = ("inference", "forward_next")


def _model() -> Model:
    return Model.load(runtime.models()[0])


async def _steps(ctx: Context, n: int, pause: float) -> list[int]:
    """``n`` generator steps, sleeping ``pause`` seconds after each (a slow inferlet)."""
    g = ctx.generate(Sampler.argmax(), max_tokens=n, stop=[])
    seen: list[int] = []
    async for step in g:
        seen += (await step.execute()).tokens
        await asyncio.sleep(pause)
    return seen


def test_a_late_inferlet_takes_the_passes_that_landed_in_one_call(dummy, observed):
    async def main(_):
        out = {}
        for pause in (0, 0.02):
            with Context(_model()) as ctx:
                ctx.user("Count to ten.")
                before = observed.calls.count(NEXT)
                out[pause] = (await _steps(ctx, 12, pause), observed.calls.count(NEXT) - before, ctx.seq_len)
        return out

    out = dummy.value(main)
    (fast, fast_calls, fast_len), (slow, slow_calls, slow_len) = out[0], out[0.02]
    assert slow == fast and slow_len == fast_len and len(fast) == 12
    assert fast_calls == 11  # one call per step after the first pass: nothing had landed ahead
    assert slow_calls <= 6, slow_calls  # two passes at a time (DEPTH): about half as many calls


def test_passes_taken_but_not_used_are_truncated_before_the_context_is_used_again(dummy, observed):
    async def broken_off(pause: float) -> tuple:
        """Four steps of a longer generation, then a fork and four more tokens on both."""
        with Context(_model()) as ctx:
            ctx.user("Count to ten.")
            g = ctx.generate(Sampler.argmax(), max_tokens=20, stop=[])
            first = []
            async for step in g:
                first += (await step.execute()).tokens
                await asyncio.sleep(pause)  # a slow inferlet: the engine runs two passes ahead meanwhile
                if len(first) == 4:
                    break
            taken = len(ctx._kv.ahead)
            engine_len = host_context.seq_len(ctx._kv.handle_as_is())
            sdk_len = ctx.seq_len
            fork = ctx.fork()  # touches the context: the passes nobody used go first
            settled = host_context.seq_len(ctx._kv.handle_as_is()), fork.seq_len, len(ctx._kv.ahead)
            rest = await ctx.generate(Sampler.argmax(), max_tokens=4, stop=[]).collect_tokens()
            forked = await fork.generate(Sampler.argmax(), max_tokens=4, stop=[]).collect_tokens()
            fork.release()
            return taken, engine_len, sdk_len, settled, first + rest, first + forked

    async def main(_):
        return await broken_off(0), await broken_off(0.02)

    prompt, late = dummy.value(main)
    assert prompt[0] == 0 and prompt[1] == prompt[2]  # in step: nothing taken ahead
    taken, engine_len, sdk_len, settled, continued, forked = late
    assert taken >= 1 and engine_len == sdk_len + taken  # the engine held passes the program never saw
    assert settled == (sdk_len, sdk_len, 0) and sdk_len == prompt[2]
    assert continued == forked == prompt[4] == prompt[5]  # positions and KV as if it had never run ahead


def test_a_stop_among_the_passes_taken_at_once_ends_the_generation_there(dummy, observed):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("Count to ten.")
            reference = await _steps(ctx, 10, 0)
        stop = reference[5]
        with Context(_model()) as ctx:
            ctx.user("Count to ten.")
            g = ctx.generate(Sampler.argmax(), max_tokens=10, stop=[stop])
            seen = []
            async for step in g:
                seen += (await step.execute()).tokens
                await asyncio.sleep(0.02)
            return reference, seen, ctx.seq_len, host_context.seq_len(ctx._kv.handle), len(ctx._kv.ahead)

    reference, seen, sdk_len, engine_len, left = dummy.value(main)
    assert seen == reference[:5] and left == 0 and engine_len == sdk_len


def test_unused_passes_that_fill_a_page_are_still_truncated(dummy, observed):
    # The pass that completes a page would commit it (committed pages cannot be truncated): the
    # passes taken ahead keep their pages working until the next pass is recorded.
    async def main(_):
        for pad in ([], [1]):  # which steps take a pass ahead depends on the prompt's length
            with Context(_model()) as ctx:
                ctx.user("Count to ten.")
                ctx.append(pad)
                ps = ctx.page_size
                g = ctx.generate(Sampler.argmax(), max_tokens=3 * ps, stop=[])
                async for step in g:
                    await step.execute()
                    await asyncio.sleep(0.02)
                    n, a = ctx.seq_len, len(ctx._kv.ahead)
                    if (n + a) // ps > n // ps:
                        break  # the passes taken ahead filled a page
                else:
                    continue
                ctx.truncate(1)  # touches the context: the unused passes go first
                return n, host_context.seq_len(ctx._kv.handle), ctx.seq_len
        raise AssertionError("never broke off where a page ends")

    sdk_len, engine_len, after = dummy.value(main)
    assert engine_len == after == sdk_len - 1
