"""A plain ``def main(input)``: the waiting calls (generate_text, collectors, flush,
session.receive, messaging.pull, sub.next, MCP calls) block and return their values. The process
and wasm runners accept it; the in-process runner refuses a plain main (InvalidInput)."""

import json

from inferlet import Context, Model, Sampler, mcp, messaging, runtime, session

PROMPT = "tell me a story"


def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    with Context(model) as ctx:
        ctx.user(PROMPT)
        out["text"] = ctx.generate_text(Sampler.argmax(), max_tokens=4, stop=[])
    with Context(model) as ctx:
        ctx.user(PROMPT)
        out["tokens"] = ctx.generate(Sampler.argmax(), max_tokens=4, stop=[]).collect_tokens()
        ctx.seal()
        ctx.flush()
        out["flushed"] = [ctx.buffer(), ctx.seq_len]
        ctx.user("more")
        out["batches"] = [t for t in ctx.generate(Sampler.argmax(), max_tokens=2, stop=[])]
    out["message"] = session.receive()
    out["file"] = session.receive_file().decode()
    messaging.push("runners-sync-q", "queued")
    out["pulled"] = messaging.pull("runners-sync-q")
    with messaging.subscribe("runners-sync-t") as sub:
        messaging.broadcast("runners-sync-t", "x")
        out["next"] = sub.next()
    with mcp.connect("notes") as notes:
        out["mcp"] = json.loads(notes.call_tool("add", {"a": 1, "b": 2}))["structuredContent"]
    return out
