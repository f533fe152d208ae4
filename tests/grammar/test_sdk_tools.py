"""The SDK's tool use on the dummy engine (the default model's tokenizer and chat template):
equipping and answering on a context, streaming call events, and schema-true calls from the
native call grammar whatever the logits prefer."""

from __future__ import annotations

import json

from inferlet import Context, GrammarConstraint, Model, Sampler, chat, runtime, tools
from pie_core.models.chat_formats import render_chat_template
from pie_core.models.registry import resolve_model

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}
CLOCK = {"name": "get_time", "description": "Local time", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Tokyo", "Lima"]}}, "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _template(messages: list[dict], **kw) -> list[int]:
    src = resolve_model(None)
    tools_ = [WEATHER, {"type": "function", "function": CLOCK}]
    return src.tokenizer.encode(render_chat_template(src.chat.template, messages, tools=tools_, **kw))


def test_equip_and_answer_on_a_context_equal_the_template(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.equip_tools([WEATHER, json.dumps(CLOCK)])
            ctx.user("Weather in Paris, time in Tokyo?")
            ctx.assistant(CALL)
            ctx.answer_tool("get_weather", {"sky": "clear"}).answer_tool("get_time", "14:05")
            ctx.cue()
            return ctx.buffer()

    messages = [{"role": "user", "content": "Weather in Paris, time in Tokyo?"}, {"role": "assistant", "content": CALL},
                {"role": "tool", "content": '{"sky": "clear"}'}, {"role": "tool", "content": "14:05"}]
    assert dummy.value(main) == _template(messages, add_generation_prompt=True)


def test_prefix_helpers_equal_the_template(dummy):
    async def main(_):
        model = _model()
        ids = tools.equip_prefix(model, [WEATHER, CLOCK]) + chat.user(model, "hi") + chat.cue(model)
        return ids, tools.answer_prefix(model, "get_time", ["14:05"])

    ids, answer = dummy.value(main)
    assert ids == _template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    src = resolve_model(None)
    assert src.tokenizer.decode(answer) == '<|im_start|>user\n<tool_response>\n["14:05"]\n</tool_response><|im_end|>\n'


def test_decoder_streams_start_then_call_and_queues_several(dummy):
    out: dict = {}

    async def main(_):
        model = _model()
        tok = model.tokenizer()
        dec = tools.Decoder(model)
        events = [dec.feed([t]) for t in tok.encode("Sure. " + CALL)]
        two = CALL.replace("Paris", "Oslo") + "\n" + CALL
        dec.reset()
        batch = [dec.feed(tok.encode(two)), dec.feed([]), dec.feed([])]
        out.update(kinds=[type(e).__name__ for e in events], last=events[-1], batch=batch,
                   parsed=tools.parse_call(model, "x " + CALL), start=len(tok.encode("Sure. ")))

    dummy.value(main)  # events are not JSON: they come back through ``out``
    kinds, last, batch, parsed = out["kinds"], out["last"], out["batch"], out["parsed"]
    assert kinds == ["Idle"] * out["start"] + ["Start"] + ["Idle"] * (len(kinds) - out["start"] - 2) + ["Call"]
    assert (last.name, json.loads(last.args)) == ("get_weather", {"city": "Paris"})
    assert [type(e).__name__ for e in batch] == ["Call", "Call", "Idle"]
    assert [json.loads(e.args)["city"] for e in batch[:2]] == ["Oslo", "Paris"]
    assert parsed == tools.Event.Call("get_weather", '{"city": "Paris"}')


def test_native_matcher_holds_random_logits_to_schema_true_calls(dummy):
    async def main(_):
        model = _model()
        out = []
        for seed in (1, 2, 3, 4):
            with Context(model) as ctx:
                ctx.equip_tools([WEATHER, CLOCK])
                ctx.user("go")
                matcher = tools.native_matcher(model, [WEATHER, CLOCK], choice="required")
                g = ctx.generate(Sampler.top_p(1.0, 1.0, seed=seed), max_tokens=200,
                                 constrain=GrammarConstraint(matcher))
                text = model.tokenizer().decode(await g.collect_tokens())
                call = tools.parse_call(model, text)
                out.append((text, None if call is None else (call.name, json.loads(call.args))))
        return out

    schema_true = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"}),
                   ("get_time", {"city": "Tokyo"}), ("get_time", {"city": "Lima"})]
    for text, call in dummy.value(main):
        assert call in schema_true, text
        assert text.startswith("<tool_call>") and "</tool_call>" in text, text
        body = json.loads(text[len("<tool_call>") : text.index("</tool_call>")])  # strict JSON, not parse_call's reading
        assert body == {"name": call[0], "arguments": call[1]}, text


def test_a_forced_tool_is_the_one_called_and_a_bad_choice_is_an_error(dummy):
    async def forced(_):
        model = _model()
        with Context(model) as ctx:
            ctx.equip_tools([WEATHER, CLOCK])
            ctx.user("go")
            matcher = tools.native_matcher(model, [WEATHER, CLOCK], choice="get_time")
            g = ctx.generate(Sampler.argmax(), max_tokens=200, constrain=GrammarConstraint(matcher))
            call = tools.parse_call(model, await g.collect_text())
            return None if call is None else call.name

    assert dummy.value(forced) == "get_time"

    async def bad(_):
        tools.native_matcher(_model(), [WEATHER], choice="get_time")

    message = dummy.error(bad)
    assert message.startswith("InvalidInput: choice must be") and "get_weather" in message
