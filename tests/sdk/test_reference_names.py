"""The reference's (and upstream's) parameter names, call by call, next to ours: each call
answers to both, giving the same result; naming one argument twice is a TypeError.

Also ``fwd.page_size()`` and the samplers' default ``k``.
"""

from __future__ import annotations

import inspect

import pytest

from inferlet import (
    Context, Grammar, GrammarConstraint, Logits, Logprob, Logprobs, Matcher, Model, Sampler, chat, mcp, runtime,
    tools,
)
from pie_core.errors import NotFound

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _model() -> Model:
    return Model.load(runtime.models()[0])


def test_logprob_probes_take_token_and_token_id_and_read_the_same_values(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([3, 4, 5])
            one = [fwd.probe(2, p) for p in (Logprob(7), Logprob(token=7), Logprob(token_id=7))]
            many = [fwd.probe(2, p) for p in (Logprobs([7, 9]), Logprobs(tokens=[7, 9]), Logprobs(token_ids=(7, 9)))]
            out = await fwd.execute()
            return [out.logprobs(h) for h in one], [out.logprobs(h) for h in many]

    one, many = dummy.value(main)
    assert len(one[0]) == 1 and one == [one[0]] * 3
    assert len(many[0]) == 2 and many == [many[0]] * 3
    assert many[0][0] == one[0][0]


def test_logprob_probes_are_one_value_under_either_name():
    assert Logprob(7) == Logprob(token=7) == Logprob(token_id=7)
    assert Logprob(token=7).token == Logprob(7).token_id == 7
    assert Logprobs(range(2)) == Logprobs(tokens=[0, 1]) == Logprobs(token_ids=(0, 1))
    assert Logprobs(tokens=[4]).tokens == Logprobs([4]).token_ids == (4,)
    with pytest.raises(TypeError, match="token= and token_id="):
        Logprob(token=1, token_id=1)
    with pytest.raises(TypeError, match="missing"):
        Logprobs()


def test_grammar_constructors_take_the_reference_names_and_ours():
    assert Grammar.from_json_schema(schema=SCHEMA) == Grammar.from_json_schema(s=SCHEMA) == \
        Grammar.from_json_schema(SCHEMA)
    assert Grammar.from_regex(pattern="a+") == Grammar.from_regex(p="a+") == Grammar.from_regex("a+")
    assert Grammar.from_ebnf(ebnf='start: "x"') == Grammar.from_ebnf(g='start: "x"') == Grammar.from_ebnf('start: "x"')
    assert Grammar.from_regex(pattern="a+").text == "a+"
    with pytest.raises(TypeError, match="pattern= and p="):
        Grammar.from_regex(pattern="a", p="b")
    params = [list(inspect.signature(f).parameters)[0]
              for f in (Grammar.from_json_schema, Grammar.from_regex, Grammar.from_ebnf)]
    assert params == ["schema", "pattern", "ebnf"]  # what help() shows


def test_grammar_constraint_constructors_take_the_reference_names_and_ours(dummy):
    async def main(_):
        model = _model()
        gc = GrammarConstraint
        pairs = [
            (gc.from_json_schema(schema=SCHEMA, model=model), gc.from_json_schema(s=SCHEMA, model=model)),
            (gc.from_regex(pattern="a+", model=model), gc.from_regex(p="a+", model=model)),
            (gc.from_ebnf(ebnf='start: "x"', model=model), gc.from_ebnf(g='start: "x"', model=model)),
            (gc.from_grammar(grammar=Grammar.json(), model=model), gc.from_grammar(g=Grammar.json(), model=model)),
        ]
        try:
            GrammarConstraint.from_json_schema(SCHEMA, model, schema=SCHEMA)
            twice = None
        except TypeError as exc:
            twice = str(exc)
        texts = [[a.matcher.grammar.text, b.matcher.grammar.text, a.model_name == b.model_name == model.name]
                 for a, b in pairs]
        return texts, twice

    pairs, twice = dummy.value(main)
    assert [a for a, _, _ in pairs][1:] == ["a+", 'start: "x"', Grammar.json().text]
    assert all(a == b and same for a, b, same in pairs)
    assert twice is not None and "schema" in twice


def test_matcher_accept_tokens_takes_token_ids_and_ids(dummy):
    async def main(_):
        tok = _model().tokenizer()
        ids = tok.encode("aaa")
        states = []
        for kwargs in ({"token_ids": ids}, {"ids": ids}):
            m = Matcher(Grammar.from_regex(pattern="a+"), tok)
            m.accept_tokens(**kwargs)
            states.append(m.is_completed)
        return states

    assert dummy.value(main) == [True, True]


def test_chat_helpers_take_message_and_msg(dummy):
    async def main(_):
        model = _model()
        helpers = (chat.system, chat.user, chat.assistant)
        return [[f(model, "hi"), f(model, message="hi"), f(model, msg="hi")] for f in helpers]

    rows = dummy.value(main)
    for positional, message, msg in rows:
        assert positional == message == msg and positional
    assert rows[0][0] != rows[1][0] != rows[2][0]


def test_tool_helpers_take_tools_and_schemas(dummy):
    async def main(_):
        model = _model()
        equip = [tools.equip_prefix(model, [WEATHER]), tools.equip_prefix(model, tools=[WEATHER]),
                 tools.equip_prefix(model, schemas=[WEATHER])]
        grammars = [tools.native_grammar(model, tools=[WEATHER]), tools.native_grammar(model, schemas=[WEATHER])]
        matchers = [tools.native_matcher(model, tools=[WEATHER]), tools.native_matcher(model, schemas=[WEATHER])]
        return equip, [g.text for g in grammars], [m.grammar.text for m in matchers]

    equip, grammars, matchers = dummy.value(main)
    assert equip[0] and equip == [equip[0]] * 3
    assert grammars[0] == grammars[1] == matchers[0] == matchers[1]


def test_mcp_connect_takes_server_name_and_name(dummy):
    async def main(_):
        found = []
        for kwargs in ({"server_name": "nosuch"}, {"name": "nosuch"}):
            try:
                mcp.connect(**kwargs)
            except NotFound as exc:
                found.append(str(exc))
        wrong = []
        for args, kwargs in (((), {}), (("a",), {"name": "a"})):
            try:
                mcp.connect(*args, **kwargs)
            except TypeError as exc:
                wrong.append(str(exc))
        return found, wrong

    found, wrong = dummy.value(main)
    assert len(found) == 2 and found[0] == found[1] and "nosuch" in found[0]
    assert len(wrong) == 2 and all("server_name" in w for w in wrong)


def test_forward_probe_takes_index_and_idx(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([3, 4, 5])
            hs = [fwd.probe(1, Logits()), fwd.probe(index=1, probe=Logits()), fwd.probe(idx=1, probe=Logits())]
            out = await fwd.execute()
            return [out.logits(h).hex() for h in hs]

    rows = dummy.value(main)
    assert rows[0] and rows == [rows[0]] * 3


def test_forward_page_size_is_the_contexts(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward()
            size = fwd.page_size()
            await fwd.input(list(range(1, 2 * size + 2))).execute()  # pages fill at page_size tokens
            return size, ctx.page_size, ctx.inner().committed_page_count(), ctx.inner().working_page_token_count()

    size, ctx_size, committed, working = dummy.value(main)
    assert size == ctx_size == dummy.engine.models[dummy.model].pool.page_size
    assert (committed, working) == (2, 1)


def test_top_k_samplers_default_to_k_40():
    assert Sampler.top_k().k == 40
    assert Sampler.top_k_top_p().k == 40
    assert Sampler.top_k(0.6, 7).k == Sampler.top_k(k=7).k == Sampler.top_k(top_k=7).k == 7


def test_generator_probes_take_index_and_idx(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("go")
            g = ctx.generate(Sampler.argmax(), max_tokens=1, stop=[])
            each = [g.probe_each_step(index=-1, probe=Logits()), g.probe_each_step(idx=-1, probe=Logits())]
            step = await g.__anext__()
            once = [step.probe(index=-1, probe=Logits()), step.probe(idx=-1, probe=Logits())]
            out = await step.execute()
            return [out.logits(h).hex() for h in each + once]

    rows = dummy.value(main)
    assert rows[0] and rows == [rows[0]] * 4
