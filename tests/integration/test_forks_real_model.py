"""Forks on the real model: shared committed pages, and continuations equal to unforked runs."""

import asyncio

import pytest

from inferlet import Context, Model, Sampler, runtime

pytestmark = pytest.mark.model

PROMPT = "Explain, step by step, how a paged KV cache lets many requests share one prompt prefix. " * 14


async def continue_from(ctx, first):
    with ctx:
        ctx.append([first])
        return await ctx.generate(Sampler.argmax(), max_tokens=6, stop=[], auto_flush=False).collect_tokens()


def test_forks_share_the_prompt_pages_and_continue_like_unforked_contexts(pie):
    pool = pie.engine.models[next(iter(pie.engine.models))].pool

    async def main(_):
        model = Model.load(runtime.models()[0])
        with Context(model) as base:
            base.user(PROMPT)
            base.cue()
            await base.flush()
            prompt_pages = base.inner().committed_page_count()
            used_before = pool.used_count
            forks = [base.fork() for _ in range(8)]
            extra_pages = pool.used_count - used_before
            # each fork continues greedily from a different forced first token
            firsts = [16, 40, 785, 1654, 2610, 3555, 5338, 8420]
            outs = await asyncio.gather(*(continue_from(f, first) for f, first in zip(forks, firsts)))
            seq_len = base.seq_len

        async def solo(first):
            ctx = Context(model)
            ctx.user(PROMPT)
            ctx.cue()
            return await continue_from(ctx, first)

        expected = await asyncio.gather(*(solo(first) for first in firsts))
        return prompt_pages, extra_pages, seq_len, outs, expected

    prompt_pages, extra_pages, seq_len, outs, expected = pie.value(main)
    assert seq_len > 300 and prompt_pages >= 300 // 16
    assert extra_pages <= 8  # at most one private (working) page per fork; the prompt is held once
    assert outs == expected
