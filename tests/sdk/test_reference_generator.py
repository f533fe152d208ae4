"""Reference section "Generator", call by call: constructor options, builder methods, inspection,
collectors and per-step iteration (constrain, speculation, adapters and zo belong to other
issues). Runs on the dummy engine; generation is kept to plain word tokens by a logit mask so
that chat stop tokens only appear where a test puts them."""

from __future__ import annotations

import numpy as np
import pytest

from inferlet import Context, Entropy, Logits, Model, ProbeHandle, Sampler, chat, runtime
from pie_core import brle
from pie_core.errors import InvalidInput

WORDS = " the quick brown fox jumps over a lazy dog while seven small birds sing"


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _words(model: Model, *extra: int) -> list[int]:
    allowed = np.zeros(model.vocab_size, dtype=bool)
    allowed[model.tokenizer().encode(WORDS)] = True
    allowed[list(extra)] = True
    return brle.encode(allowed)


async def _greedy(model: Model, n: int = 12) -> list[int]:
    with Context(model) as ctx:
        ctx.user("go")
        return await ctx.generate(Sampler.argmax(), max_tokens=n, stop=[], logit_mask=_words(model)).collect_tokens()


def _first_new(tokens: list[int], start: int) -> int:
    """Index of the first token at or after ``start`` that did not occur before it."""
    return next(k for k in range(start, len(tokens)) if tokens[k] not in tokens[:k])


class _WordsThenOnly:
    """A Constraint: plain words for the first ``n`` tokens, then only ``token``."""

    def __init__(self, model: Model, n: int, token: int) -> None:
        only = np.zeros(model.vocab_size, dtype=bool)
        only[token] = True
        self.words, self.only, self.n, self.seen = _words(model), brle.encode(only), n, 0

    def step(self, accepted: list[int]) -> list[int]:
        self.seen += len(accepted)  # the tokens accepted since the previous call
        return self.words if self.seen < self.n else self.only


def test_auto_flush_appends_the_cue_and_stops_at_the_chat_stop_tokens(dummy):
    async def main(_):
        model = _model()
        stop = chat.stop_tokens(model)[0]
        with Context(model) as ctx:
            ctx.user("hi")
            prompt = ctx.buffer()
            g = ctx.generate(Sampler.argmax(), max_tokens=5, constrain=_WordsThenOnly(model, 2, stop))
            cued = ctx.buffer()
            steps = [(await step.execute()).tokens async for step in g]
            kept = ctx.seq_len + len(ctx.buffer())
        return prompt, cued, chat.cue(model), steps, g.tokens_generated, g.is_done, kept, _words(model)

    prompt, cued, cue, steps, generated, done, kept, words = dummy.value(main)
    assert cued == prompt + cue  # before any step runs
    # two words, then the chat stop token ends it: that step accepts nothing (post stop truncation)
    assert [len(t) for t in steps] == [1, 1, 0] and generated == 2 and done
    assert brle.decode(words)[steps[0] + steps[1]].all()  # plain words, no stop token
    assert kept == len(cued) + 2  # the context holds the prompt, the cue and the two words only


def test_without_auto_flush_the_buffer_is_left_alone_and_nothing_stops_early(dummy):
    async def main(_):
        model = _model()
        stop = chat.stop_tokens(model)[0]
        allowed = np.zeros(model.vocab_size, dtype=bool)
        allowed[stop] = True
        with Context(model) as ctx:
            ctx.user("hi")
            prompt = ctx.buffer()
            g = ctx.generate(Sampler.argmax(), max_tokens=3, auto_flush=False, logit_mask=brle.encode(allowed))
            unchanged = ctx.buffer() == prompt
            return unchanged, await g.collect_tokens(), stop

    unchanged, tokens, stop = dummy.value(main)
    assert unchanged and tokens == [stop] * 3  # the chat stop token is no stop without auto_flush


def test_max_tokens_option_and_builder(dummy):
    async def main(_):
        model = _model()
        with Context(model) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=9, stop=[], logit_mask=_words(model))
            same = g.max_tokens(4) is g
            n = len(await g.collect_tokens())
            with pytest.raises(InvalidInput, match="max_tokens must be >= 1"):
                g.max_tokens(0)
            with pytest.raises(InvalidInput, match="max_tokens must be >= 1"):
                ctx.generate(Sampler.argmax(), max_tokens=-2)
            return same, n, g.tokens_generated, g.is_done

    assert dummy.value(main) == (True, 4, 4, True)


def test_stop_replaces_and_add_stop_extends_the_stop_set(dummy):
    async def main(_):
        model = _model()
        tokens = await _greedy(model)
        k = _first_new(tokens, 3)
        m = _first_new(tokens, k + 1)
        results = []
        for build in (
            lambda g: g,  # stop=[tokens[m]] only
            lambda g: g.stop([tokens[k]]),  # replaced: now only tokens[k] stops
            lambda g: g.add_stop([tokens[k]]),  # both stop: the first one met wins
        ):
            with Context(model) as ctx:
                ctx.user("go")
                g = ctx.generate(Sampler.argmax(), max_tokens=12, stop=[tokens[m]], logit_mask=_words(model))
                assert build(g) is g
                results.append(await g.collect_tokens())
        return tokens, k, m, results

    tokens, k, m, (only_m, replaced, both) = dummy.value(main)
    assert only_m == tokens[:m]  # the stop token itself is not accepted
    assert replaced == both == tokens[:k]


def test_horizon_is_a_chainable_validated_hint(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=2, stop=[], horizon=16)
            chained = g.horizon(8) is g
            with pytest.raises(InvalidInput, match="horizon"):
                g.horizon(0)
            return chained, len(await g.collect_tokens())

    assert dummy.value(main) == (True, 2)


def test_probe_each_step_reads_every_step(dummy):
    async def main(_):
        model = _model()
        with Context(model) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=4, stop=[])
            h = g.probe_each_step(-1, Logits())
            rows = []
            async for step in g:
                out = await step.execute()
                logits = np.frombuffer(out.logits(h), dtype=np.float32)
                rows.append((int(logits.argmax()), out.tokens[0]))
            return isinstance(h, ProbeHandle), rows

    is_handle, rows = dummy.value(main)
    assert is_handle and len(rows) == 4
    assert all(best == token for best, token in rows)  # argmax sampled what the probe saw


def test_step_probe_is_for_one_iteration_and_numbers_after_each_step_probes(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=2, stop=[])
            every = g.probe_each_step(-1, Entropy())
            step = await g.__anext__()
            once = step.probe(-1, Logits())
            first = await step.execute()
            second = await (await g.__anext__()).execute()
            return (
                every.row, once.row, len(first.raw.probes), len(second.raw.probes),
                first.entropy(every) is not None, second.entropy(every) is not None, second.logits(once),
            )

    every, once, n_first, n_second, e1, e2, gone = dummy.value(main)
    assert (every, once, n_first, n_second) == (0, 1, 2, 1)
    assert e1 and e2 and gone is None


def test_driving_with_anext_until_stop_async_iteration(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=2, stop=[])
            outs = [await (await g.__anext__()).execute(), await (await g.__anext__()).execute()]
            with pytest.raises(StopAsyncIteration):
                await g.__anext__()
            return [o.tokens for o in outs], g.is_done

    tokens, done = dummy.value(main)
    assert [len(t) for t in tokens] == [1, 1] and done


def test_clear_sampler_then_accept_your_own_token(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=3, stop=[])
            picked, seen = [], []
            async for step in g:
                h = step.clear_sampler().probe(-1, Logits())
                out = await step.execute()
                seen.append((out.auto_sampler, out.tokens, g.tokens_generated))
                logits = np.frombuffer(out.logits(h), dtype=np.float32)
                choice = int(np.argsort(logits)[-2])  # the runner-up, never what argmax picks
                assert g.accept([choice]) == [choice]
                picked.append(choice)
            return picked, seen, g.is_done, ctx.seq_len, ctx.buffer()

    picked, seen, done, seq_len, buffer = dummy.value(main)
    assert all(auto is None and tokens == [] for auto, tokens, _ in seen)
    assert [n for _, _, n in seen] == [0, 1, 2]  # nothing counted until accepted
    assert done and buffer == [picked[-1]]  # the accepted token waits for the next pass


def test_accept_stops_at_max_tokens_and_stop_tokens(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            g = ctx.generate(Sampler.argmax(), max_tokens=3, stop=[7], auto_flush=False)
            capped = g.accept([1, 2, 3, 4])
            late = g.accept([5])
        with Context(_model()) as ctx:
            h = ctx.generate(Sampler.argmax(), max_tokens=10, stop=[7], auto_flush=False)
            stopped = h.accept([1, 7, 2])
            return capped, late, g.is_done, stopped, h.is_done, ctx.buffer()

    capped, late, g_done, stopped, h_done, buffer = dummy.value(main)
    assert capped == [1, 2, 3] and late == [] and g_done
    assert stopped == [1] and h_done and buffer == [1]  # the stop token ends it: neither reported nor kept


def test_a_step_runs_once(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=2, stop=[])
            step = await g.__anext__()
            await step.execute()
            with pytest.raises(InvalidInput, match="already executed"):
                await step.execute()
            return g.tokens_generated

    assert dummy.value(main) == 1


def test_unknown_options_and_non_samplers_are_refused(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            with pytest.raises(TypeError, match="unexpected keyword argument 'max_token'"):
                ctx.generate(Sampler.argmax(), max_token=3)
            with pytest.raises(TypeError, match="needs a Sampler"):
                ctx.generate("argmax")
            return ctx.buffer()

    assert dummy.value(main) == []
