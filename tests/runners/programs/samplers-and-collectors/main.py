"""Every sampler drives ctx.generate, seeded so that its tokens repeat; the collectors
(collect_tokens, collect_text, collect_json, tokens, text); stop tokens end generation without
being accepted; the generator's builder methods and inspection properties."""

from inferlet import Context, Model, Sampler, runtime


def check(cond, what):
    if not cond:
        raise AssertionError(what)


SAMPLERS = {
    "argmax": lambda: Sampler.argmax(),
    "greedy": lambda: Sampler.greedy(),
    "top_k": lambda: Sampler.top_k(0.8, 20, seed=11),
    "top_p": lambda: Sampler.top_p(0.9, 0.9, seed=12),
    "min_p": lambda: Sampler.min_p(0.7, 0.05, seed=13),
    "top_k_top_p": lambda: Sampler.top_k_top_p(0.8, 30, 0.9, seed=14),
    "multinomial": lambda: Sampler.multinomial(1.0, 1, seed=15),
    "multinomial_3": lambda: Sampler.multinomial(1.0, 3, seed=16),
    "dist": lambda: Sampler.dist(0.9, seed=17),
}


async def run(model, sampler, **options):
    with Context(model) as ctx:
        ctx.user("Tell me a story.")
        options.setdefault("max_tokens", 3)
        options.setdefault("stop", [])
        return await ctx.generate(sampler, **options).collect_tokens()


async def main(input):
    model = Model.load(runtime.models()[0])
    out = {"samplers": {}}
    for name, make in SAMPLERS.items():
        first = await run(model, make())
        check(first == await run(model, make()), f"{name} with a seed repeats its tokens")
        out["samplers"][name] = first
    check(out["samplers"]["argmax"] == out["samplers"]["greedy"], "greedy is argmax")
    out["sampler_fields"] = [Sampler.top_k(0.5, top_k=7).k, Sampler.top_p(top_p=0.5).p, Sampler.min_p(min_p=0.2).min_prob,
                             Sampler.embedding().draws_tokens, Sampler.dist().output]

    # stop: the first argmax token as a stop token ends generation at once, unaccepted
    first_tok = out["samplers"]["argmax"][0]
    with Context(model) as ctx:
        ctx.user("Tell me a story.")
        g = ctx.generate(Sampler.argmax(), max_tokens=3, stop=[first_tok])
        out["stopped"] = [await g.collect_tokens(), g.tokens_generated, g.is_done, ctx.buffer()[-3:]]

    # builder methods: max_tokens, stop, add_stop, stop_tokens
    with Context(model) as ctx:
        ctx.user("Tell me a story.")
        g = ctx.generate(Sampler.argmax())
        check(set(g.stop_tokens) == {151645, 151643}, f"auto_flush stops at the chat format's tokens, got {g.stop_tokens}")
        g.max_tokens(5).stop([1]).add_stop([2, 3])
        out["builder_stop"] = sorted(g.stop_tokens)
        check(g.tokens_generated == 0 and not g.is_done, "a fresh generator")
        tokens = await g.tokens()
        out["builder_tokens"] = [tokens, g.tokens_generated, g.is_done]

    with Context(model) as ctx:
        ctx.user("Say something.")
        text = await ctx.generate(Sampler.argmax(), max_tokens=4, stop=[]).collect_text()
        ctx.seal().user("Again.")
        text2 = await ctx.generate(Sampler.argmax(), max_tokens=4).text()
        again = await ctx.generate_text(Sampler.argmax(), max_tokens=2)
        out["texts"] = [text, text2, again]

    with Context(model) as ctx:
        ctx.user("Give JSON.")
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        value = await ctx.generate(Sampler.argmax(), max_tokens=20).collect_json(schema=schema)
        check(isinstance(value, dict) and isinstance(value.get("ok"), bool), f"collect_json follows the schema: {value!r}")
        ctx.seal().user("And a string.")
        parsed = await ctx.generate(Sampler.argmax(), max_tokens=20).collect_json(
            schema='{"enum": ["red", "green"]}', parse=lambda s: ["parsed", s])
        out["json"] = [value, parsed]
    return out
