"""Tool agent: two tools written here, called by the model, answered by the inferlet.

The tools are ordinary Python functions with a JSON Schema for their arguments. The context is
equipped with them (``ctx.equip_tools``: the model's own template lists them), then:

1. The first turn must call tools: ``tools.native_matcher(..., choice="required")`` holds the
   reply to the model's native call syntax, each call to one of the tools and its arguments to
   that tool's schema. ``tools.Decoder`` picks the calls out of the stream as they complete.
   Each call runs here and its result goes back with ``ctx.answer_tool``.
2. Each later turn is tried on a fork with calls optional (``choice="auto"``). New calls make
   the fork the conversation and are answered in turn; anything else drops the fork (a small
   model tends to repeat calls it already made: such a turn is cut short at the repeat).
3. The reply is asked for on the conversation, held to one plain sentence by a regex.
"""

import json
from typing import Any, Callable, Collection

from inferlet import Context, GrammarConstraint, Model, Regex, Sampler, runtime, session, tools

FUNCTIONS: dict[str, Callable[..., Any]] = {}
SCHEMAS: list[dict[str, Any]] = []


def tool(description: str, **params: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a tool whose arguments are ``params`` (all required)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        FUNCTIONS[fn.__name__] = fn
        parameters = {"type": "object", "properties": params, "required": list(params)}
        SCHEMAS.append({"type": "function",
                        "function": {"name": fn.__name__, "description": description, "parameters": parameters}})
        return fn

    return register


@tool("Current weather in a city.", city={"type": "string"})
def get_weather(city: str) -> dict[str, Any]:
    skies = {"paris": "sunny, 21 C", "tokyo": "rain, 17 C", "berlin": "cloudy, 12 C"}
    return {"city": city, "weather": skies.get(city.strip().lower(), "clear, 19 C")}


@tool("Current local time in a city.", city={"type": "string"})
def get_time(city: str) -> dict[str, Any]:
    offsets = {"paris": 1, "tokyo": 9, "berlin": 1, "new york": -5}
    hour = (12 + offsets.get(city.strip().lower(), 0)) % 24
    return {"city": city, "time": f"{hour:02d}:05"}


REPLY = r"The [^<>{}\[\]`\n]+"
"""The reply: one plain sentence (no markup, which a small model likes to echo)."""


async def turn(
    ctx: Context, model: Model, choice: str, max_tokens: int, seen: Collection[tuple[str, str]] = ()
) -> list[tools.Event.Call]:
    """One model turn under the tool-call grammar; the calls it made, in order. The turn is cut
    short at a call repeating one in ``seen``: the model is going round in circles."""
    matcher = tools.native_matcher(model, SCHEMAS, choice=choice)
    g = ctx.generate(Sampler.argmax(), max_tokens=max_tokens, constrain=GrammarConstraint(matcher))
    decoder = tools.Decoder(model)
    calls = []
    async for step in g:
        event = decoder.feed((await step.execute()).tokens)
        while not isinstance(event, tools.Event.Idle):  # a batch may complete several calls
            if isinstance(event, tools.Event.Call):
                calls.append(event)
            event = decoder.feed([])
        if any((c.name, c.args) in seen for c in calls):
            break
    ctx.seal()
    return calls


def answer(ctx: Context, calls: list[tools.Event.Call], log: list[dict[str, Any]]) -> None:
    for call in calls:
        args = json.loads(call.args)
        result = FUNCTIONS[call.name](**args)
        log.append({"name": call.name, "args": args, "result": result})
        session.send(f"{call.name}({call.args}) -> {json.dumps(result)}")
        ctx.answer_tool(call.name, result)


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    limit = input["max_tokens"]
    log: list[dict[str, Any]] = []
    ctx = Context(model)
    try:
        ctx.equip_tools(SCHEMAS)
        ctx.user(input["question"])
        calls = await turn(ctx, model, "required", limit)
        answer(ctx, calls, log)
        seen = {(c.name, c.args) for c in calls}
        for _ in range(input["max_rounds"] - 1):
            attempt = ctx.fork()
            calls = await turn(attempt, model, "auto", limit, seen)
            fresh = [c for c in calls if (c.name, c.args) not in seen]
            if not fresh:
                attempt.release()
                break
            ctx.release()
            ctx = attempt
            answer(ctx, calls, log)
            seen.update((c.name, c.args) for c in calls)
        reply = await ctx.generate(Sampler.argmax(), max_tokens=limit, constrain=Regex(REPLY)).collect_text()
    finally:
        ctx.release()
    return {"calls": log, "reply": reply}
