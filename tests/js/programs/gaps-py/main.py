"""The Python twin of programs/gaps."""

from inferlet import Adapter, Context, Model, Regex, Sampler, reasoning, runtime, tools, zo
from inferlet.host import tools as host_tools

WEATHER = {"name": "weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class Oracle:
    def __init__(self, ref, ctx):
        self.ref, self.ctx, self.seen, self.calls = ref, ctx, 0, []

    def draft(self):
        ahead = self.ref[self.seen: self.seen + 2]
        drafts = ahead + [7] if len(ahead) == 2 else ahead
        start = self.ctx.seq_len + len(self.ctx.buffer())
        self.calls.append(["draft", drafts])
        return drafts, list(range(start, start + len(drafts)))

    def accept(self, tokens):
        self.calls.append(["accept", list(tokens)])
        self.seen += len(tokens)

    def rollback(self, n):
        self.calls.append(["rollback", n])


def event(ev):
    kind = type(ev).__name__.lower()
    out = {"type": kind}
    if kind in ("delta", "end"):
        out["text"] = ev.text
    if kind == "call":
        out["name"], out["args"] = ev.name, ev.args
    return out


def prompt(model):
    ctx = Context(model)
    ctx.user("Repeat after me: one two three one two three one two three")
    return ctx


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    tk = model.tokenizer()
    out = {}

    ids = list(tk.encode("alpha beta gamma delta épsilon zeta"))
    dec = reasoning.Decoder(model, (ids[1], ids[3]))
    out["reasoning"] = [event(dec.feed([t])) for t in [*ids, ids[1], ids[0], ids[1], ids[2], ids[3]]]
    out["reasoningBatch"] = event(reasoning.Decoder(model, (ids[1], ids[3])).feed(ids))
    markers = reasoning.Decoder(model).markers
    out["markers"] = None if markers is None else list(markers)

    text = "Sure.\n" + host_tools.format_call(model.name, "weather", {"city": "Paris"})
    tdec = tools.Decoder(model)
    out["toolEvents"] = [e for e in (event(tdec.feed([t])) for t in tk.encode(text)) if e["type"] != "idle"]
    parsed = tools.parse_call(model, text)
    out["parsed"] = None if parsed is None else event(parsed)
    with Context(model) as ctx:
        ctx.equip_tools([WEATHER]).user("Weather in Paris?").answer_tool("weather", {"temp": 21})
        out["equipped"] = list(ctx.buffer())

    with prompt(model) as ctx:
        reference = list(await ctx.generate(Sampler.argmax(), max_tokens=9, stop=[]).collect_tokens())
    out["reference"] = reference
    with prompt(model) as ctx:
        spec = Oracle(reference, ctx)
        g = ctx.generate(Sampler.argmax(), max_tokens=9, stop=[], speculator=spec)
        steps = []
        async for step in g:
            steps.append(list((await step.execute()).tokens))
        out["speculator"] = [steps, spec.calls, ctx.seq_len, list(ctx.buffer())]
    with prompt(model) as ctx:
        g = ctx.generate(Sampler.argmax(), max_tokens=9, stop=[], system_speculation=True, horizon=4)
        steps = 0
        async for step in g:
            await step.execute()
            steps += 1
        out["system"] = [list(await g.collect_tokens()), steps > 0]
    code = Regex("[0-9]{3}-[a-z]{3}")
    with prompt(model) as ctx:
        plain = list(await ctx.generate(Sampler.argmax(), max_tokens=12, constrain=code).collect_tokens())
    with prompt(model) as ctx:
        spec = Oracle(plain, ctx)
        g = ctx.generate(Sampler.argmax(), max_tokens=12, constrain=code, speculator=spec)
        out["grammar"] = [plain, list(await g.collect_tokens()), spec.calls]
    with prompt(model) as ctx:
        out["grammarSystem"] = list(await ctx.generate(Sampler.argmax(), max_tokens=12, constrain=code,
                                                      system_speculation=True).collect_tokens())
    try:
        with prompt(model) as ctx:
            ctx.generate(Sampler.argmax(), speculator=Oracle([], ctx), system_speculation=True)
    except Exception:  # noqa: BLE001
        out["both"] = True

    with Adapter.create(model, "gaps-zo") as a:
        await zo.initialize(a, 4, 8.0, 2, 0.5, 0.01)
        scored = []
        for seed in (11, 12):
            with prompt(model) as ctx:
                scored.append(list(await ctx.generate(Sampler.argmax(), max_tokens=4, adapter=a, zo_seed=seed)
                                   .collect_tokens()))
        await zo.update(a, [1.0, 0.0], [11, 12], 0.1)
        out["zo"] = scored
    return out
