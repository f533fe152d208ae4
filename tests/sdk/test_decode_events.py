"""The readme's decoded generation: ``async for event in ctx.generate(s, decode=True, ...)``.

The default model (Qwen 2.5) has no reasoning markers, so reasoning tests patch the host's
``reasoning_markers`` to two tokens of a known greedy generation (the reasoning decoder's own
tests do the same with ``<tool_call>``).
"""

from __future__ import annotations

import numpy as np
import pytest

from inferlet import Context, Decoder, Event, EventStream, Model, Sampler, chat, runtime
from pie_core import brle
from pie_core.errors import InvalidInput

WORDS = " the quick brown fox jumps over a lazy dog while seven small birds sing"


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _greedy(model: Model, **options) -> dict:
    """Greedy generation over the tokens of WORDS only (plain text, deterministic)."""
    allowed = np.zeros(model.vocab_size, dtype=bool)
    allowed[model.tokenizer().encode(WORDS)] = True
    return dict(max_tokens=14, stop=[], logit_mask=brle.encode(allowed)) | options


async def _greedy_tokens(model: Model, **options) -> list[int]:
    with Context(model) as ctx:
        ctx.user("tell me")
        return await ctx.generate(Sampler.argmax(), **_greedy(model, **options)).collect_tokens()


async def _events(model: Model, **options) -> list[list]:
    with Context(model) as ctx:
        ctx.user("tell me")
        stream = ctx.generate(Sampler.argmax(), decode=True, **_greedy(model, **options))
        assert isinstance(stream, EventStream)
        return [_plain(e) async for e in stream]


def _plain(event) -> list:
    """``[kind, text]``: inferlet results must be JSON."""
    return [type(event).__name__, event.text]


def _texts(events: list[list], kind: str) -> str:
    return "".join(text for k, text in events if k == kind)


def test_text_events_stream_the_reply_and_done_comes_last_with_all_of_it(dummy):
    async def main(_):
        model = _model()
        tokens = await _greedy_tokens(model)
        with Context(model) as ctx:
            ctx.user("tell me")
            text = await ctx.generate(Sampler.argmax(), **_greedy(model)).collect_text()
        return await _events(model), model.tokenizer().decode(tokens), text

    events, decoded, collected = dummy.value(main)
    assert all(k == "Text" for k, _ in events[:-1]) and len(events) > 2
    assert events[-1] == ["Done", decoded]
    assert _texts(events, "Text") == decoded == collected


def test_the_generators_stop_token_ends_the_stream_and_is_not_text(dummy):
    async def main(_):
        model = _model()
        tokens = await _greedy_tokens(model)
        k = next(k for k in range(2, len(tokens)) if tokens[k] not in tokens[:k])
        events = await _events(model, stop=[tokens[k]])
        with Context(model) as ctx:
            ctx.user("tell me")
            text = await ctx.generate(Sampler.argmax(), **_greedy(model, stop=[tokens[k]])).collect_text()
        return events, model.tokenizer().decode(tokens[:k]), text

    events, before_stop, collected = dummy.value(main)
    assert events[-1] == ["Done", before_stop] and _texts(events, "Text") == before_stop
    assert collected == before_stop


def test_reasoning_is_split_from_the_reply(dummy, observed):
    async def main(_):
        model = _model()
        tokens = await _greedy_tokens(model)
        # a start marker that occurs once, and the first later token that differs from it
        i = next(i for i in range(1, len(tokens) - 4) if tokens.count(tokens[i]) == 1)
        j = next(j for j in range(i + 2, len(tokens) - 1) if tokens[j] not in tokens[i + 1 : j])
        observed.override(("model", "reasoning_markers"), lambda name: (tokens[i], tokens[j]))
        tok = model.tokenizer()
        expected = tok.decode(tokens[:i]), tok.decode(tokens[i + 1 : j]), tok.decode(tokens[j + 1 :])
        return await _events(model, reasoning=True), expected

    events, (before, thought, after) = dummy.value(main)
    kinds = [k for k, _ in events]
    first_thought, done_thinking = kinds.index("Thinking"), kinds.index("ThinkingDone")
    assert set(kinds[:first_thought]) == {"Text"} and set(kinds[first_thought:done_thinking]) == {"Thinking"}
    assert set(kinds[done_thinking + 1 : -1]) == {"Text"} and kinds[-1] == "Done"
    assert _texts(events, "Thinking") == events[done_thinking][1] == thought
    assert events[-1][1] == _texts(events, "Text") == before + after.lstrip("\n")


def test_max_tokens_inside_reasoning_closes_it_before_done(dummy, observed):
    async def main(_):
        model = _model()
        tokens = await _greedy_tokens(model)
        i = next(i for i in range(1, len(tokens) - 2) if tokens.count(tokens[i]) == 1)
        never = next(t for t in range(model.vocab_size) if t not in tokens)
        observed.override(("model", "reasoning_markers"), lambda name: (tokens[i], never))
        tok = model.tokenizer()
        return await _events(model, reasoning=True), tok.decode(tokens[:i]), tok.decode(tokens[i + 1 :])

    events, before, thought = dummy.value(main)
    assert events[-2:] == [["ThinkingDone", thought], ["Done", before]]


def test_reasoning_on_a_model_without_markers_is_all_text(dummy):
    async def main(_):
        model = _model()
        return await _events(model, reasoning=True), await _events(model)

    with_reasoning, plain = dummy.value(main)
    assert with_reasoning == plain


def test_decoder_joins_split_characters_and_drops_the_newlines_after_thinking(dummy, observed):
    async def main(_):
        model = _model()
        tok = model.tokenizer()
        start, end = tok.encode("<tool_call>")[0], tok.encode("</tool_call>")[0]
        observed.override(("model", "reasoning_markers"), lambda name: (start, end))
        dec = Decoder(model, reasoning=True)
        ids = [start, *tok.encode("weigh 🤗"), end, *tok.encode("\n\nanswer: 中文 🤗")]
        events = [e for t in ids for e in dec.feed([t])]
        return [_plain(e) for e in events], dec.finish() == [Event.Done("answer: 中文 🤗")]

    events, finish_gives_done = dummy.value(main)
    assert not any("\ufffd" in text for _, text in events)
    assert ["ThinkingDone", "weigh 🤗"] in events
    assert _texts(events, "Thinking") == "weigh 🤗"
    assert _texts(events, "Text") == "answer: 中文 🤗"
    assert finish_gives_done


def test_stream_text_and_tokens_and_generator_aliases(dummy):
    async def main(_):
        model = _model()
        results = []
        for collect in (
            lambda c: c.generate(Sampler.argmax(), decode=True, **_greedy(model)).text(),
            lambda c: c.generate(Sampler.argmax(), **_greedy(model)).text(),
            lambda c: c.generate(Sampler.argmax(), **_greedy(model)).collect_text(),
            lambda c: c.generate(Sampler.argmax(), decode=True, **_greedy(model)).tokens(),
            lambda c: c.generate(Sampler.argmax(), **_greedy(model)).tokens(),
            lambda c: c.generate(Sampler.argmax(), **_greedy(model)).collect_tokens(),
        ):
            with Context(model) as ctx:
                ctx.user("tell me")
                results.append(await collect(ctx))
        return results

    stream_text, text, collected, stream_tokens, tokens, collected_tokens = dummy.value(main)
    assert stream_text == text == collected and stream_tokens == tokens == collected_tokens


def test_breaking_out_of_the_stream_keeps_what_was_generated(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("tell me")
            stream = ctx.generate(Sampler.argmax(), decode=True, **_greedy(ctx.model))
            async for event in stream:
                if isinstance(event, Event.Text):
                    break
            return stream.generator.tokens_generated, stream.generator.is_done, ctx.seq_len > 0

    generated, done, ran = dummy.value(main)
    assert 1 <= generated < 14 and not done and ran


def test_tool_calls_become_tool_call_events_and_leave_the_reply(dummy):
    async def main(_):
        model = _model()
        tok = model.tokenizer()
        dec = Decoder(model, tool_use=True)
        reply = (
            'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
        )
        events = [e for t in tok.encode(reply) for e in dec.feed([t])]
        events += dec.feed(chat.stop_tokens(model)[:1])
        return [[type(e).__name__, *vars_of(e)] for e in events]

    def vars_of(e) -> list:
        return [getattr(e, f) for f in ("text", "name", "arguments") if hasattr(e, f)]

    assert dummy.value(main) == [
        ["Text", "Sure"], ["Text", "."],
        ["ToolCallStart"], ["ToolCall", "get_weather", '{"city": "Paris"}'],
        ["ToolCallStart"], ["ToolCall", "get_time", "{}"],
        ["Done", "Sure."],
    ]


def test_tool_use_on_a_reply_without_calls_is_plain_text(dummy):
    async def main(_):
        model = _model()
        return await _events(model, tool_use=True), await _events(model)

    with_tools, plain = dummy.value(main)
    assert with_tools == plain


def test_reasoning_or_tool_use_without_decode_is_refused_before_anything_changes(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("call a tool")
            before = ctx.buffer()
            for option in ("reasoning", "tool_use"):
                with pytest.raises(InvalidInput, match="pass decode=True"):
                    ctx.generate(Sampler.argmax(), **{option: True})
            return before == ctx.buffer()

    assert dummy.value(main) is True
