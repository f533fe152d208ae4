"""A Grammar is a Schema (the reference's ``&Grammar`` implementor): it goes wherever a schema
goes, and ``tools.native_grammar`` gives one over the model's tool-call syntax."""

from __future__ import annotations

import json
import re

import pytest

from inferlet import Context, Grammar, GrammarConstraint, Model, Regex, Sampler, Schema, runtime, tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}
CLOCK = {"name": "get_time", "description": "Local time", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Tokyo", "Lima"]}}, "required": ["city"]}}


def _model() -> Model:
    return Model.load(runtime.models()[0])


def test_a_grammar_is_a_schema_that_builds_a_fresh_constraint_each_time(dummy):
    async def main(_):
        model = _model()
        grammar = Grammar.from_regex("ab")
        a, b = grammar.build_constraint(model), grammar.build_constraint(model)
        return isinstance(grammar, Schema), type(a).__name__, a is not b, a.matcher.grammar == grammar

    assert dummy.value(main) == (True, "GrammarConstraint", True, True)


def test_constrain_takes_a_grammar_in_generate_in_a_list_and_in_g_constrain(dummy):
    async def main(_):
        model = _model()
        grammar = Grammar.from_regex("(yes|no)!")
        texts = []
        for how in ("option", "list", "builder"):
            with Context(model) as ctx:
                ctx.user("answer")
                if how == "option":
                    g = ctx.generate(Sampler.top_p(1.0, 1.0, seed=3), max_tokens=20, constrain=grammar)
                elif how == "list":  # ANDed with another schema: only "no!" is left
                    g = ctx.generate(Sampler.top_p(1.0, 1.0, seed=3), max_tokens=20, constrain=[grammar, Regex("n.*")])
                else:
                    g = ctx.generate(Sampler.top_p(1.0, 1.0, seed=3), max_tokens=20).constrain(grammar)
                texts.append(await g.collect_text())
        return texts

    option, both, builder = dummy.value(main)
    assert re.fullmatch("(yes|no)!", option) and re.fullmatch("(yes|no)!", builder)
    assert both == "no!"


def test_collect_json_takes_a_grammar_as_its_schema(dummy):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 5}},
              "required": ["n"], "additionalProperties": False}

    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("a number")
            g = ctx.generate(Sampler.top_p(1.0, 1.0, seed=5), max_tokens=40)
            return await g.collect_json(schema=Grammar.from_json_schema(schema))

    value = dummy.value(main)
    assert set(value) == {"n"} and 3 <= value["n"] <= 5


def test_a_grammar_used_by_two_generators_gives_each_its_own_state(dummy):
    async def main(_):
        model = _model()
        grammar = Grammar.from_regex("[ab]{4}")
        with Context(model) as one, Context(model) as two:
            one.user("x")
            two.user("y")
            g1 = one.generate(Sampler.top_p(1.0, 1.0, seed=1), max_tokens=10, constrain=grammar)
            g2 = two.generate(Sampler.top_p(1.0, 1.0, seed=2), max_tokens=10, constrain=grammar)
            for _ in range(2):  # interleaved: one generator's tokens must not advance the other
                await (await g1.__anext__()).execute()
                await (await g2.__anext__()).execute()
            return await g1.collect_text(), await g2.collect_text()

    for text in dummy.value(main):
        assert re.fullmatch("[ab]{4}", text), text


def test_native_grammar_constrains_a_generator_as_it_is(dummy):
    async def main(_):
        model = _model()
        grammar = tools.native_grammar(model, [WEATHER, CLOCK], choice="get_time")
        with Context(model) as ctx:
            ctx.equip_tools([WEATHER, CLOCK])
            ctx.user("go")
            text = await ctx.generate(Sampler.top_p(1.0, 1.0, seed=4), max_tokens=200, constrain=grammar).collect_text()
        call = tools.parse_call(model, text)
        matcher = tools.native_matcher(model, [WEATHER, CLOCK], choice="get_time")
        return isinstance(grammar, Grammar), call.name, json.loads(call.args), matcher.grammar == grammar

    is_grammar, name, args, same = dummy.value(main)
    assert is_grammar and same
    assert name == "get_time" and args["city"] in ("Tokyo", "Lima") and set(args) == {"city"}


def test_native_grammar_and_matcher_are_none_without_a_tool_call_syntax(dummy, observed):
    observed.override(("tools", "syntax"), lambda name: None)  # a model whose format writes no tool calls
    observed.override(("tools", "call_grammar"), lambda name, schemas, choice: None)

    async def main(_):
        model = _model()
        return tools.native_grammar(model, [WEATHER]), tools.native_matcher(model, [WEATHER])

    assert dummy.value(main) == (None, None)


def test_native_grammar_refuses_an_unknown_choice(dummy):
    async def main(_):
        tools.native_grammar(_model(), [WEATHER], choice="nosuch")

    final, _ = dummy.run(main)
    assert final.kind == "error" and final.value.startswith("InvalidInput:") and "get_weather" in final.value


def test_a_grammar_constraint_from_a_grammar_still_works_beside_it(dummy):
    async def main(_):
        model = _model()
        with Context(model) as ctx:
            ctx.user("x")
            gc = GrammarConstraint.from_grammar(Grammar.from_regex("ok"), model)
            return await ctx.generate(Sampler.argmax(), max_tokens=10, constrain=gc).collect_text()

    assert dummy.value(main) == "ok"


@pytest.mark.parametrize("bad", [42, "not a schema"])
def test_constrain_names_grammar_among_what_it_takes(dummy, bad):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.generate(Sampler.argmax(), max_tokens=1, constrain=bad)

    final, _ = dummy.run(main)
    assert final.kind == "error" and "a Grammar" in final.value
