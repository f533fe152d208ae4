"""Tool use in the model's own syntax: the inferlet.tools helpers (equip_prefix, answer_prefix,
parse_call, native_grammar, native_matcher, Decoder; format_call from the host layer),
ctx.equip_tools/answer_tool, and a call forced by the native grammar that a
``decode=True, tool_use=True`` stream reports as ToolCallStart/ToolCall, none of its markup as
text."""

import json

from inferlet import Context, Event, GrammarConstraint, Matcher, Model, Sampler, runtime, tools
from inferlet.host import tools as host_tools

PICK = {"type": "function", "function": {
    "name": "pick", "description": "Pick a speed.",
    "parameters": {"type": "object", "properties": {"speed": {"enum": ["fast", "slow"]}}, "required": ["speed"],
                   "additionalProperties": False}}}
BARE = {"name": "noop", "description": "Does nothing.", "parameters": {"type": "object", "properties": {}}}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def refused(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]
    return None


async def main(input):
    model = Model.load(runtime.models()[0])
    tk = model.tokenizer()
    out = {}
    prefix = tools.equip_prefix(model, [PICK, json.dumps(BARE)])
    out["equip_prefix"] = [len(prefix), tk.decode(prefix)[:80]]
    check(tools.equip_prefix(model, schemas=[PICK]) == tools.equip_prefix(model, [PICK]), "schemas= is tools=")
    answer = tools.answer_prefix(model, "pick", {"ok": True})
    out["answer_prefix"] = tk.decode(answer)
    out["answer_prefix_str"] = tk.decode(tools.answer_prefix(model, "pick", "done"))

    call_text = host_tools.format_call(model.name, "pick", {"speed": "fast"})
    out["format_call"] = call_text
    call = tools.parse_call(model, "Sure. " + call_text)
    check(isinstance(call, tools.Event.Call) and call.name == "pick", f"parse_call reads the call back: {call!r}")
    out["parse_call"] = [call.name, json.loads(call.args)]
    out["parse_none"] = tools.parse_call(model, "no call here")
    out["parse_bad"] = refused(lambda: tools.parse_call(model, "<tool_call>\nnot json\n</tool_call>"))

    dec = tools.Decoder(model)
    seen = []
    for t in tk.encode(call_text):
        ev = dec.feed([t])
        if not isinstance(ev, tools.Event.Idle):
            seen.append(type(ev).__name__)
    out["decoder"] = [seen, dec.inside]

    grammar = tools.native_grammar(model, [PICK], choice="pick")
    out["native_grammar"] = grammar.kind
    matcher = tools.native_matcher(model, [PICK])
    check(isinstance(matcher, Matcher), "native_matcher gives a Matcher")
    matcher.accept_tokens(tk.encode(call_text))
    out["native_matcher_completed"] = matcher.is_completed
    out["bad_choice"] = refused(lambda: tools.native_grammar(model, [PICK], choice="nope"))
    out["nameless"] = refused(lambda: tools.equip_prefix(model, [{"description": "no name"}]))

    with Context(model) as ctx:
        ctx.equip_tools([PICK])
        ctx.user("Go fast.")
        out["equipped_buffer_len"] = len(ctx.buffer())
        stream = ctx.generate(Sampler.argmax(), decode=True, tool_use=True, max_tokens=80, constrain=grammar)
        events = []
        async for e in stream:
            events.append([type(e).__name__, getattr(e, "name", None), getattr(e, "arguments", None), getattr(e, "text", None)])
        check(any(e[0] == "ToolCall" for e in events), f"the forced call is reported: {events}")
        texts = [e[3] for e in events if e[0] == "Text"]
        check(not any("<" in t or "tool_call" in t for t in texts), f"no call markup is text: {events}")
        check(events[-1][3] == "".join(texts), f"Done carries the streamed text: {events}")
        out["events"] = events
        ctx.seal()
        ctx.answer_tool("pick", {"speed": "fast", "ok": True})
        tail = len(ctx.buffer())
        reply = await ctx.generate(Sampler.argmax(), max_tokens=3, stop=[]).collect_tokens()
        out["after_answer"] = [tail, reply]
    with Context(model) as ctx:
        ctx.equip_tools([PICK], system="Use tools wisely.")
        ctx.user("Call it.")
        g = ctx.generate(Sampler.argmax(), max_tokens=80, constrain=GrammarConstraint(tools.native_matcher(model, [PICK],
                                                                                                            choice="required")))
        text = tk.decode(await g.collect_tokens())
        parsed = tools.parse_call(model, text)
        out["required_call"] = [parsed.name if parsed else None, g.is_done]
    return out
