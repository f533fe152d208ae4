"""``ctx.forward(flush=True)``: a pass that runs the buffered tokens with probes and samples."""

from __future__ import annotations

import pytest

from inferlet import Context, Entropy, Logprob, Model, Sampler, runtime
from pie_core.errors import InvalidInput


def _model() -> Model:
    return Model.load(runtime.models()[0])


def test_probes_over_the_buffer_equal_a_raw_pass_over_the_same_tokens(dummy):
    async def main(_):
        model = _model()
        with Context(model) as a, Context(model) as b:
            a.user("score me")
            b.user("score me")
            a.cue().append([100, 200])
            b.cue().append([100, 200])
            tokens = a.buffer()
            n = len(tokens)

            fwd = a.forward(flush=True)
            start = fwd.start_position()
            lp = [fwd.probe(i, Logprob(t)) for i, t in enumerate(tokens[1:])]
            ent = fwd.probe(n - 1, Entropy())
            tok = fwd.sample([n - 1], Sampler.argmax())
            out = await fwd.execute()

            raw = b.forward()
            raw.input(b.buffer())
            lp_raw = [raw.probe(i, Logprob(t)) for i, t in enumerate(tokens[1:])]
            ent_raw = raw.probe(n - 1, Entropy())
            tok_raw = raw.sample([n - 1], Sampler.argmax())
            out_raw = await raw.execute()
            return (
                [out.logprobs(h) for h in lp], out.entropy(ent), out.token(tok),
                [out_raw.logprobs(h) for h in lp_raw], out_raw.entropy(ent_raw), out_raw.token(tok_raw),
                start, a.seq_len, a.buffer(), n, b.buffer(),
            )

    lps, ent, tok, lps_raw, ent_raw, tok_raw, start, seq_len, buffer, n, b_buffer = dummy.value(main)
    assert lps == lps_raw and ent == ent_raw and tok == tok_raw
    assert start == 0 and seq_len == n and buffer == []  # the pass flushed the buffer
    assert len(b_buffer) == n  # a raw pass leaves the buffer alone


def test_more_input_follows_the_buffered_rows(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append([1, 2, 3])
            fwd = ctx.forward(flush=True).input([4, 5])
            h = fwd.sample([4], Sampler.argmax())
            out = await fwd.execute()
            return ctx.seq_len, ctx.buffer(), out.token(h) is not None

    assert dummy.value(main) == (5, [], True)


def test_a_failed_pass_puts_the_buffer_back(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append([1, 2, 3])
            fwd = ctx.forward(flush=True)
            fwd.probe(7, Entropy())
            with pytest.raises(InvalidInput, match="probe index 7 is outside"):
                await fwd.execute()
            kept = ctx.buffer(), ctx.seq_len
            await ctx.flush()
            return kept, ctx.buffer(), ctx.seq_len

    assert dummy.value(main) == (([1, 2, 3], 0), [], 3)


def test_tokens_appended_after_building_the_pass_stay_buffered(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append([1, 2])
            fwd = ctx.forward(flush=True)
            ctx.append([3])
            await fwd.execute()
            return ctx.buffer(), ctx.seq_len

    assert dummy.value(main) == ([3], 2)


def test_a_pass_whose_buffer_was_run_meanwhile_is_refused(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append([1, 2])
            fwd = ctx.forward(flush=True)
            await ctx.flush()
            with pytest.raises(InvalidInput, match="buffer was run or changed"):
                await fwd.execute()
            return ctx.seq_len, ctx.buffer()

    assert dummy.value(main) == (2, [])
