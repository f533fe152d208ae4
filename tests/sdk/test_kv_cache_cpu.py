"""Truncation, prefix reuse, suspension, rejected drafts and a failed step, through the SDK on the
cpu backend with a tiny random model. Each test ends by checking the context's next logits
against a fresh context's (kv_oracle.py), which a wrong, stale or missing KV page changes."""

import pytest
from kv_oracle import assert_same_logits, fresh_logits, history, logits_after, model

from inferlet import Context, Sampler
from pie_core.errors import OutOfPages

PROMPT = [40 + (7 * i) % 50 for i in range(30)]


def test_truncated_tokens_leave_no_trace_in_the_next_pass(cpu):
    async def main(_):
        with Context(model()) as ctx:
            ctx.append(PROMPT[:5])  # one committed page, one token in the working page
            await ctx.flush()
            await logits_after(ctx, [201, 202])  # fills the working page to 3 of 4
            ctx.truncate(2)
            seq_len = ctx.seq_len
            got = await logits_after(ctx, [9, 10, 11])  # rewrites the truncated slots, crosses a page
            return seq_len, got, await fresh_logits(PROMPT[:5] + [9, 10, 11])

    seq_len, got, want = cpu.value(main)
    assert seq_len == 5
    assert_same_logits(got, want)


def test_a_prefix_taken_from_the_cache_gives_the_logits_of_computing_it(cpu):
    async def main(_):
        want = await fresh_logits(PROMPT[:14] + [3])
        with Context(model()) as first:
            first.append(PROMPT[:14])  # 3 full pages go into the prefix cache
            await first.flush()
            hits = cpu.pool.cache.hits
            with Context(model()) as second:
                got = await logits_after(second, PROMPT[:14] + [3])
                adopted = cpu.pool.cache.hits - hits
                shared = second.inner().committed_page_count() and second._ctx.kv.pages[:3] == first._ctx.kv.pages[:3]
        return adopted, shared, got, want

    adopted, shared, got, want = cpu.value(main)
    assert adopted == 3 and shared  # the test is about reuse: the pages were taken, not computed
    assert_same_logits(got, want)


@pytest.mark.parametrize("cached", [True, False], ids=["committed-pages-cached", "cache-cleared"])
def test_a_suspended_context_continues_where_it_was(cpu, cached):
    async def main(_):
        with Context(model()) as ctx:
            ctx.append(PROMPT[:10])  # ends mid-page
            await ctx.flush()
            ctx.suspend()
            suspended, freed = ctx.suspended, cpu.pool.is_whole()  # only the prefix cache holds pages
            if not cached:  # every page comes back from the host copy
                cpu.pool.cache.clear()
            got = await logits_after(ctx, [12, 13])
            return suspended, freed, ctx.suspended, got, await fresh_logits(PROMPT[:10] + [12, 13])

    suspended, freed, after, got, want = cpu.value(main)
    assert suspended and freed and not after
    assert_same_logits(got, want)


class WrongDrafts:
    """Drafts the known continuation ``right`` tokens deep, then ``wrong`` tokens it never makes."""

    def __init__(self, reference: list[int], start: int, right: int, wrong: int) -> None:
        self.ref, self.start, self.right, self.wrong, self.seen = reference, start, right, wrong, 0
        self.rolled_back = 0

    def draft(self):
        ahead = self.ref[self.seen : self.seen + self.right]
        drafts = ahead + [(t + 1) % 200 for t in self.ref[self.seen + len(ahead) : self.seen + len(ahead) + self.wrong]]
        base = self.start + self.seen + 1
        return drafts, list(range(base, base + len(drafts)))

    def accept(self, tokens):
        self.seen += len(tokens)

    def rollback(self, n):
        self.rolled_back += n


def test_rejected_drafts_leave_the_kv_as_generation_without_speculation(cpu):
    async def main(_):
        with Context(model()) as plain:
            plain.append(PROMPT[:9])
            ref = await plain.generate(Sampler.argmax(), max_tokens=12, stop=[], auto_flush=False).collect_tokens()
        with Context(model()) as ctx:
            ctx.append(PROMPT[:9])
            spec = WrongDrafts(ref, 8, right=2, wrong=3)
            got = await ctx.generate(Sampler.argmax(), max_tokens=12, stop=[], auto_flush=False,
                                     speculator=spec).collect_tokens()
            seq = history(ctx) + [77]
            after = await logits_after(ctx, [77])
            return ref, got, spec.rolled_back, seq, after, await fresh_logits(seq)

    ref, got, rolled_back, seq, after, want = cpu.value(main)
    assert got == ref and rolled_back > 0
    assert seq == PROMPT[:9] + ref + [77]
    assert_same_logits(after, want)


def test_a_step_refused_for_pages_keeps_the_buffer_and_runs_when_retried(cpu):
    async def main(_):
        with Context(model()) as ctx:
            ctx.append(PROMPT[:4])
            await ctx.flush()
            ctx.append(PROMPT[4:20])  # 16 buffered tokens: 4 more pages
            gen = ctx.generate(Sampler.argmax(), max_tokens=2, stop=[], auto_flush=False)
            cpu.pool.accounts.limit_of = lambda user: 3  # this user may hold 3 pages
            try:
                step = await gen.__anext__()
                try:
                    await step.execute()
                    refused = None
                except OutOfPages as exc:
                    refused = str(exc)
            finally:
                cpu.pool.accounts.limit_of = None
            kept = (ctx.buffer(), ctx.seq_len, gen.tokens_generated)
            first = await (await gen.__anext__()).execute()
            seq = history(ctx) + [5]
            after = await logits_after(ctx, [5])
            return refused, kept, first.tokens, seq, after, await fresh_logits(seq)

    refused, kept, first, seq, after, want = cpu.value(main)
    assert refused is not None and "quota" in refused
    assert kept == (PROMPT[4:20], 4, 0)  # nothing of the refused step ran or was lost
    assert len(first) == 1 and seq == PROMPT[:20] + first + [5]
    assert_same_logits(after, want)
