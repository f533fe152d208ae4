"""The readme's synchronous forms inside ``async def main``: ``for tokens in g``, ``for event in
ctx.generate(..., decode=True)``, ``for msg in sub``, and MCP calls returning ``str``. Where the
runner lets an inferlet block (process, wasm) each gives what its async form gives (checked
here); in-process each raises Unsupported, whose text is the observation then."""

import inspect
import json

from inferlet import Context, Model, Sampler, mcp, messaging, runtime
from inferlet.host.errors import Unsupported

PROMPT = "tell me a story"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def asked(model):
    ctx = Context(model)
    ctx.user(PROMPT)
    return ctx


async def main(input):
    model = Model.load(runtime.models()[0])
    opts = dict(max_tokens=4, stop=[])
    forms, reference = {}, {}
    with asked(model) as ctx:
        reference["tokens"] = await ctx.generate(Sampler.argmax(), **opts).collect_tokens()
    with asked(model) as ctx:
        reference["events"] = [[type(e).__name__, e.text] async for e in ctx.generate(Sampler.argmax(), decode=True, **opts)]
    with asked(model) as ctx:
        reference["text"] = await ctx.generate_text(Sampler.argmax(), **opts)

    with asked(model) as ctx:
        try:
            batches = [tokens for tokens in ctx.generate(Sampler.argmax(), **opts)]
            check([t for b in batches for t in b] == reference["tokens"], f"for tokens in g: {batches}")
            forms["for_tokens"] = "same"
        except Unsupported as exc:
            forms["for_tokens"] = f"Unsupported: {exc}"
    with asked(model) as ctx:
        try:
            events = [[type(e).__name__, e.text] for e in ctx.generate(Sampler.argmax(), decode=True, **opts)]
            check(events == reference["events"], f"for event in stream: {events}")
            forms["for_events"] = "same"
        except Unsupported as exc:
            forms["for_events"] = f"Unsupported: {exc}"
    with asked(model) as ctx:
        pending = ctx.generate_text(Sampler.argmax(), **opts)  # coroutine code: a coroutine everywhere
        forms["generate_text_in_async"] = type(pending).__name__
        check(await pending == reference["text"], "awaiting generate_text gives the text")
    with messaging.subscribe("runners-sync") as sub:
        messaging.broadcast("runners-sync", "a")
        messaging.broadcast("runners-sync", "b")
        try:
            got = []
            for msg in sub:
                got.append(msg)
                if len(got) == 2:
                    break
            check(got == ["a", "b"], f"for msg in sub: {got}")
            forms["for_messages"] = "same"
        except Unsupported as exc:
            forms["for_messages"] = f"Unsupported: {exc}"
            await sub.next()
            await sub.next()
    with mcp.connect("notes") as notes:
        raw = notes.call_tool("shout", {"text": "sync"})
        forms["mcp_call_type"] = "str" if isinstance(raw, str) else type(raw).__name__
        text = await raw  # awaitable either way
        check(json.loads(text)["content"][0]["text"] == "SYNC", "the MCP call's result")
    return {"forms": forms, "reference": reference}
