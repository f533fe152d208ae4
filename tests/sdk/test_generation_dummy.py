import asyncio
from dataclasses import replace

import numpy as np
import pytest

from inferlet import Context, Entropy, Logprobs, Model, Sampler, runtime
from pie_core import brle
from pie_core.errors import InvalidInput


def _model() -> Model:
    return Model.load(runtime.models()[0])


def test_generate_stops_at_max_tokens_and_keeps_tokens_in_context(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("count to ten")
            prompt_len = len(ctx.buffer())
            g = ctx.generate(Sampler.argmax(), max_tokens=7, stop=[])
            tokens = await g.collect_tokens()
            return len(tokens), g.tokens_generated, g.is_done, ctx.seq_len, ctx.buffer(), tokens, prompt_len

    n, generated, done, seq_len, buffer, tokens, prompt_len = dummy.value(main)
    assert n == generated == 7 and done
    assert buffer == [tokens[-1]]  # the last token waits in the buffer for the next pass
    cue_len = seq_len - prompt_len - 6
    assert cue_len > 0


def test_greedy_generation_is_deterministic(dummy):
    async def main(_):
        out = []
        for _ in range(2):
            with Context(_model()) as ctx:
                ctx.user("same prompt")
                out.append(await ctx.generate(Sampler.argmax(), max_tokens=5, stop=[]).collect_tokens())
        return out

    a, b = dummy.value(main)
    assert a == b


def test_step_loop_reports_accepted_tokens(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("hi")
            g = ctx.generate(Sampler.argmax(), max_tokens=3, stop=[])
            seen = []
            async for step in g:
                out = await step.execute()
                seen.append((out.tokens, out.token(out.auto_sampler)))
            return seen

    seen = dummy.value(main)
    assert len(seen) == 3 and all(toks == [tok] for toks, tok in seen)


def test_sixteen_concurrent_inferlets_are_batched_and_match_solo_runs(dummy):
    async def one(i):
        with Context(_model()) as ctx:
            ctx.user(f"prompt number {i}")
            return await ctx.generate(Sampler.argmax(), max_tokens=6, stop=[]).collect_tokens()

    solo = [dummy.value(lambda _, i=i: one(i)) for i in range(16)]
    stats = dummy.engine.models[dummy.model].batcher.stats
    before = stats.sizes.copy()

    async def all_together():
        results = await asyncio.gather(*(dummy.run_async(lambda _, i=i: one(i)) for i in range(16)))
        return [final.value for final, _ in results]

    together = asyncio.run(all_together())
    assert together == solo
    new_sizes = stats.sizes - before
    assert max(new_sizes) > 1, f"no multi-request batch was formed: {dict(new_sizes)}"


def test_logit_mask_restricts_sampled_tokens(dummy):
    async def main(_):
        model = _model()
        allowed = np.zeros(model.vocab_size, dtype=bool)
        allowed[[11, 22, 33]] = True
        with Context(model) as ctx:
            ctx.user("pick")
            g = ctx.generate(Sampler.top_p(1.0, 1.0), max_tokens=20, stop=[], logit_mask=brle.encode(allowed))
            return await g.collect_tokens()

    assert set(dummy.value(main)) <= {11, 22, 33}


def test_probes_and_handles_of_the_wrong_kind(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([1, 2, 3])
            s = fwd.sample([2], Sampler.argmax())
            e = fwd.probe(1, Entropy())
            lp = fwd.probe(2, Logprobs([5, 6]))
            out = await fwd.execute()
            return out.token(s), out.entropy(e), out.logprobs(lp), out.entropy(lp), out.logits(e), out.tokens

    tok, ent, lps, wrong, wrong2, tokens = dummy.value(main)
    assert isinstance(tok, int) and ent > 0 and len(lps) == 2
    assert wrong is None and wrong2 is None and tokens == []


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda f, v: f.input([v]), "token ids must be >= 0 and <"),
        # outside what the wire carries: refused by the SDK before the call leaves, in every runner
        (lambda f, v: f.input([-1]), "inference.forward(): tokens must be ints >= 0 and < 4294967296, got -1 at index 0"),
        (lambda f, v: f.input_at([1, 2], [0, -3]),
         "inference.forward(): positions must be ints >= 0 and < 4294967296, got -3 at index 1"),
        (lambda f, v: f.input_at([1, 2], [4, 4]), "positions within one pass must be distinct"),
        (lambda f, v: f.input([1, 2]).attention_mask([[0, 2]]), "got 1 attention mask rows for 2 input tokens"),
        (lambda f, v: f.input([1, 2]).attention_mask([[0, 2], [0, 3]]), "BRLE covers 3 entries, expected 2"),
    ],
)
def test_bad_forward_input_is_a_clear_error_and_nothing_leaks(dummy, build, message):
    async def main(_):
        model = _model()
        with Context(model) as ctx:
            fwd = ctx.forward()
            build(fwd, model.vocab_size)
            try:
                await fwd.execute()
            except InvalidInput as exc:
                return str(exc), ctx.seq_len
            return "no error", ctx.seq_len

    text, seq_len = dummy.value(main)
    assert message in text and seq_len == 0


def test_probe_index_outside_the_pass(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([1, 2])
            fwd.probe(5, Entropy())
            await fwd.execute()

    final, _ = dummy.run(main)
    assert final.kind == "error" and "probe index 5 is outside this pass's 2 input tokens" in final.value


def test_released_context_refuses_use(dummy):
    async def main(_):
        ctx = Context(_model())
        ctx.release()
        ctx.user("x")

    final, _ = dummy.run(main)
    assert final.kind == "error" and "released" in final.value


def test_cancelled_inferlet_frees_its_pages(dummy):
    flushed = asyncio.Event()
    held: list[bool] = []

    async def main(_):
        ctx = Context(_model())
        ctx.user("a long wait " * 20)
        await ctx.flush()
        held.append(not dummy.engine.pools_whole())
        flushed.set()
        await asyncio.Event().wait()  # until cancelled

    async def go():
        task = asyncio.ensure_future(dummy.run_async(main))
        await flushed.wait()  # cancel only once the context holds its pages
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert held == [True]
    assert dummy.engine.pools_whole()


def test_stop_token_ends_generation_and_is_left_for_seal(dummy):
    async def main(_):
        model = _model()
        from inferlet import chat

        stop = chat.stop_tokens(model)[0]
        allowed = np.zeros(model.vocab_size, dtype=bool)
        allowed[stop] = True
        with Context(model) as ctx:
            ctx.user("say nothing")
            g = ctx.generate(Sampler.argmax(), max_tokens=10, logit_mask=brle.encode(allowed))
            tokens = await g.collect_tokens()
            buffer = ctx.buffer()
            ctx.seal()
            return tokens, g.tokens_generated, g.is_done, buffer, ctx.buffer(), chat.seal(model)

    tokens, generated, done, buffer, sealed, seal = dummy.value(main)
    assert tokens == [] and generated == 0 and done  # the stop token ends it, uncounted
    assert buffer == [] and sealed == seal



def test_a_pass_beyond_the_backends_sample_row_limit_is_refused_before_running(dummy):
    loaded = dummy.engine.models[dummy.model]
    caps = loaded.caps
    loaded.caps = replace(caps, max_sample_rows=4)  # a backend that samples at most 4 rows per batch

    async def main(_):
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            fwd = ctx.forward().input([1] * 5)
            fwd.sample(list(range(5)), Sampler.argmax())
            try:
                await fwd.execute()
            except InvalidInput as err:
                return str(err), ctx.seq_len
        return "ran", None

    try:
        message, seq_len = dummy.value(main)
    finally:
        loaded.caps = caps
    assert "takes at most 4" in message and seq_len == 0
