import json
import time

from inferlet import Context, Model, Sampler, mcp, runtime, session


async def main(input: dict):
    mode, server, target = input["mode"], input["server"], input["target"]
    args = json.loads(input["args"])
    if mode == "list":
        return mcp.available_servers()
    if mode == "list-later":  # lists once a message arrives
        await session.receive()
        return mcp.available_servers()
    if mode == "call":  # the server's tool names and the first text of one tool call
        async with mcp.connect(server) as s:
            tools = [t["name"] for t in json.loads(await s.list_tools())["tools"]]
            result = json.loads(await s.call_tool(target, args))
        return {"tools": tools, "text": result["content"][0]["text"]}
    if mode == "read":
        with mcp.connect(server) as s:
            return json.loads(await s.read_resource(target))["contents"][0]["text"]
    if mode == "catch":  # holds KV pages across one call; an McpError becomes the result
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user("hold pages during the call")
            await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
            session.send("calling")
            try:
                await mcp.connect(server).call_tool(target, args)
            except mcp.McpError as exc:
                return f"McpError: {exc}"
            return "no error"
    if mode == "bench":  # seconds per sequential call_tool round trip
        with mcp.connect(server) as s:
            times = []
            for _ in range(input["repeat"]):
                t0 = time.perf_counter()
                await s.call_tool(target, args)
                times.append(time.perf_counter() - t0)
            return times
    raise ValueError(f"unknown mode {mode!r}")
