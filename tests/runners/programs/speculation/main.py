"""Speculative decoding gives the tokens of plain decoding: a custom Speculator that drafts two
right tokens and one wrong one per step (and sees draft/accept/rollback), the runtime's n-gram
drafter (system_speculation=True), and drafts verified by hand with fwd.draft/fwd.system_drafts."""

from inferlet import Context, Model, Regex, Sampler, Speculator, runtime


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Oracle:
    """Drafts the next ``right`` tokens of a known continuation, then one wrong token."""

    def __init__(self, reference, ctx):
        self.ref, self.ctx = reference, ctx
        self.seen = 0
        self.calls = []

    def draft(self):
        ahead = self.ref[self.seen: self.seen + 2]
        drafts = ahead + [7] if len(ahead) == 2 else ahead
        start = self.ctx.seq_len + len(self.ctx.buffer())
        self.calls.append(["draft", list(drafts)])
        return drafts, list(range(start, start + len(drafts)))

    def accept(self, tokens):
        self.calls.append(["accept", list(tokens)])
        self.seen += len(tokens)

    def rollback(self, n):
        self.calls.append(["rollback", n])

    def reset(self):
        self.seen = 0


def prompt(model, text="Repeat after me: one two three one two three one two three"):
    ctx = Context(model)
    ctx.user(text)
    return ctx


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {}
    with prompt(model) as ctx:
        reference = await ctx.generate(Sampler.argmax(), max_tokens=9, stop=[]).collect_tokens()
        after = [ctx.seq_len, ctx.buffer()]
    out["reference"] = reference

    with prompt(model) as ctx:
        spec = Oracle(reference, ctx)
        check(isinstance(spec, Speculator), "Oracle satisfies the Speculator protocol")
        g = ctx.generate(Sampler.argmax(), max_tokens=9, stop=[], speculator=spec)
        steps = []
        async for step in g:
            steps.append((await step.execute()).tokens)
        check([t for s in steps for t in s] == reference, f"speculation changed the tokens: {steps}")
        check([ctx.seq_len, ctx.buffer()] == after, "speculation leaves the context as plain decoding does")
        out["speculator"] = [steps, spec.calls]

    with prompt(model) as ctx:
        tokens = await ctx.generate(Sampler.argmax(), max_tokens=9, stop=[], system_speculation=True).collect_tokens()
        check(tokens == reference, f"system speculation changed the tokens: {tokens}")
    with prompt(model) as ctx:  # with a grammar: drafts are cut where the grammar forbids them
        plain = await ctx.generate(Sampler.argmax(), max_tokens=6, constrain=Regex("(ab|cd)+")).collect_tokens()
    with prompt(model) as ctx:
        sped = await ctx.generate(Sampler.argmax(), max_tokens=6, constrain=Regex("(ab|cd)+"),
                                  system_speculation=True).collect_tokens()
        check(sped == plain, f"speculation under a grammar changed the tokens: {sped} != {plain}")
        out["grammar"] = plain
    with prompt(model) as ctx:
        try:
            ctx.generate(Sampler.argmax(), speculator=Oracle([], ctx), system_speculation=True)
        except Exception as exc:  # noqa: BLE001
            out["both"] = [type(exc).__name__, str(exc)]

    with Context(model) as ctx:  # drafts by hand
        pattern = [5, 6, 7, 8]
        ctx.append(pattern * 3)
        await ctx.flush()
        fwd = ctx.forward()
        fwd.input([5])
        proposed = fwd.system_drafts(3)
        out["system_drafts"] = proposed
        probe = ctx.forward()
        probe.input([5])
        h = probe.sample([0], Sampler.argmax())
        first = (await probe.execute()).token(h)
        ctx.truncate(1)
        fwd = ctx.forward()
        fwd.input([5])
        fwd.draft([first, 9])
        rows = fwd.sample([0, 1, 2], Sampler.argmax())
        o = await fwd.execute()
        out["manual_drafts"] = [first, o.raw.drafts_kept, o.tokens_at(rows), ctx.seq_len]
        check(o.raw.drafts_kept >= 1, "the right draft is kept")
        try:
            fwd = ctx.forward()
            fwd.draft([1])
            fwd.input([2])
        except Exception as exc:  # noqa: BLE001
            out["input_after_draft"] = [type(exc).__name__, str(exc)]
    return out
