"""Constrained generation: every built-in Schema (JsonSchema, Regex, Ebnf, AnyJson, a Grammar),
GrammarConstraint, a custom Constraint, a static logit_mask, constraints ANDed in a list and by
g.constrain, and a combination that allows nothing."""

import json

from inferlet import (AnyJson, Constraint, Context, Ebnf, Grammar, GrammarConstraint, JsonSchema, Model, Regex,
                      Sampler, Schema, runtime)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Window:
    """A custom Constraint: only ids in [lo, lo + width), and it records what it was told."""

    def __init__(self, lo, width, vocab):
        self.runs = [lo, width, vocab - lo - width]
        self.seen = []

    def step(self, accepted):
        self.seen.append(list(accepted))
        return self.runs


class Shout:
    """A custom Schema: builds a regex constraint."""

    def build_constraint(self, model):
        return GrammarConstraint.from_regex("(YES|NO)!", model)


async def generate(model, prompt="Answer.", **options):
    with Context(model) as ctx:
        ctx.user(prompt)
        g = ctx.generate(Sampler.argmax(), **options)
        tokens = await g.collect_tokens()
        return tokens, model.tokenizer().decode(tokens), g.is_done


async def main(input):
    model = Model.load(runtime.models()[0])
    vocab = model.vocab_size
    out = {}
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}, "n": {"type": "boolean"}},
              "required": ["color", "n"], "additionalProperties": False}
    tokens, text, done = await generate(model, constrain=JsonSchema(schema), max_tokens=30)
    check(set(json.loads(text)) == {"color", "n"} and done, f"JsonSchema output follows the schema: {text!r}")
    out["json_schema"] = [tokens, text]
    tokens, text, done = await generate(model, constrain=JsonSchema(json.dumps(schema), whitespace=True), max_tokens=30)
    out["json_schema_ws"] = [tokens, done]
    tokens, text, done = await generate(model, constrain=Regex("(cat|dog)s?"), max_tokens=10)
    check(text in ("cat", "cats", "dog", "dogs") and done, f"Regex output matches: {text!r}")
    out["regex"] = [tokens, text]
    tokens, text, done = await generate(model, constrain=Ebnf('start: "x" ("y" | "z") "!"'), max_tokens=10)
    check(text in ("xy!", "xz!") and done, f"Ebnf output matches: {text!r}")
    out["ebnf"] = [tokens, text]
    tokens, text, done = await generate(model, constrain=Ebnf('root ::= "a" [0-9]'), max_tokens=10)
    out["gbnf"] = [tokens, text]
    tokens, text, done = await generate(model, constrain=AnyJson(), max_tokens=6)
    out["any_json"] = [tokens, done]
    tokens, text, done = await generate(model, constrain=Grammar.from_regex("[ab]{3}"), max_tokens=10)
    out["grammar_schema"] = [tokens, text]
    tokens, text, done = await generate(model, constrain=GrammarConstraint.from_ebnf('start: "ok"', model), max_tokens=5)
    out["grammar_constraint"] = [tokens, text]
    tokens, text, done = await generate(model, constrain=GrammarConstraint.json(model), max_tokens=4)
    out["grammar_constraint_json"] = tokens
    tokens, text, done = await generate(model, constrain=GrammarConstraint.from_json_schema({"type": "boolean"}, model),
                                        max_tokens=5)
    out["grammar_constraint_schema"] = text
    check(isinstance(Shout(), Schema) and isinstance(Window(0, 1, 2), Constraint), "the protocols are runtime-checkable")
    tokens, text, done = await generate(model, constrain=Shout(), max_tokens=5)
    out["custom_schema"] = text

    window = Window(1000, 50, vocab)
    tokens, text, done = await generate(model, constrain=window, max_tokens=4, stop=[])
    check(all(1000 <= t < 1050 for t in tokens), f"the custom constraint's window holds: {tokens}")
    out["custom_constraint"] = [tokens, window.seen]

    tokens, text, done = await generate(model, logit_mask=[500, 20, vocab - 520], max_tokens=4, stop=[])
    check(all(500 <= t < 520 for t in tokens), f"logit_mask holds: {tokens}")
    out["logit_mask"] = tokens

    both = [Window(500, 100, vocab), Window(550, 100, vocab)]
    tokens, text, done = await generate(model, constrain=both, max_tokens=4, stop=[])
    check(all(550 <= t < 600 for t in tokens), f"a list of constraints is ANDed: {tokens}")
    out["anded_list"] = tokens

    with Context(model) as ctx:
        ctx.user("Answer.")
        g = ctx.generate(Sampler.argmax(), max_tokens=4, stop=[], logit_mask=[500, 100, vocab - 600])
        g.constrain(Window(580, 100, vocab))
        tokens = await g.collect_tokens()
        check(all(580 <= t < 600 for t in tokens), f"g.constrain ANDs with logit_mask: {tokens}")
        out["builder_constrain"] = tokens

    try:
        await generate(model, constrain=[Window(0, 10, vocab), Window(20, 10, vocab)], max_tokens=2, stop=[])
        out["nothing_allowed"] = None
    except Exception as exc:  # noqa: BLE001
        out["nothing_allowed"] = [type(exc).__name__, str(exc)]
    for bad in (lambda: Regex("(unclosed"), lambda: JsonSchema("{not json"), lambda: Ebnf("start: undefined_rule"),
                lambda: Context(model).generate(Sampler.argmax(), constrain=42)):
        try:
            bad()
            out.setdefault("refused", []).append(None)
        except Exception as exc:  # noqa: BLE001
            out.setdefault("refused", []).append([type(exc).__name__, str(exc)])
    return out
