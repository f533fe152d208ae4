"""Constrained generation through the SDK on the dummy backend (random logits, real tokenizer):
every output obeys its constraints, whatever the logits prefer."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from inferlet import (
    AnyJson,
    Context,
    Ebnf,
    Grammar,
    GrammarConstraint,
    JsonSchema,
    Matcher,
    Model,
    Regex,
    Sampler,
    runtime,
)
from pie_core import brle
from pie_core.host import model as host_model
from schemas import heavy_schema


def _model() -> Model:
    return Model.load(runtime.models()[0])


def test_regex_constraint_output_matches_in_full(dummy):
    async def main(_):
        out = []
        for seed in (1, 2, 3):
            with Context(_model()) as ctx:
                ctx.user("a code please")
                g = ctx.generate(Sampler.top_p(1.0, 0.95, seed=seed), max_tokens=30, constrain=Regex(r"[A-Z]{2}-[0-9]{3}"))
                out.append(await g.collect_text())
        return out

    for text in dummy.value(main):
        assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", text), text


def test_collect_json_parses_a_reply_that_follows_the_schema(dummy):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "tag": {"enum": ["x", "y"]}}, "required": ["n", "tag"]}

    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("json")
            a = await ctx.generate(Sampler.argmax(), max_tokens=40).collect_json(schema=schema)
        with Context(_model()) as ctx:
            ctx.user("json")
            b = await ctx.generate(Sampler.argmax(), max_tokens=40).collect_json(schema=json.dumps(schema), parse=str.upper)
        return a, b

    a, b = dummy.value(main)
    assert set(a) == {"n", "tag"} and 0 <= a["n"] <= 99 and a["tag"] in ("x", "y")
    assert b == json.dumps(a).upper()  # parse got the JSON text (one line, ", " and ": ")


def test_collect_json_without_a_schema_gives_any_json_and_a_cut_reply_is_an_error(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("json")
            g = ctx.generate(Sampler.argmax(), max_tokens=3)
            await g.collect_json()

    assert "not complete JSON" in dummy.error(main) and "raise max_tokens" in dummy.error(main)


def test_constraints_compose_from_kwarg_builder_and_static_mask(dummy):
    async def main(_):
        model = _model()
        tok = model.tokenizer()
        digits = [tok.encode(str(d))[0] for d in range(10)]
        allowed = np.zeros(model.vocab_size, dtype=bool)
        allowed[digits[:5]] = True  # the static mask: digits 0-4 (and no stop token)
        allowed[host_model.stop_tokens(model.name)] = True
        with Context(model) as ctx:
            ctx.user("digits")
            g = ctx.generate(Sampler.top_p(1.0, 1.0, seed=9), max_tokens=12, logit_mask=brle.encode(allowed),
                             constrain=Regex(r"[0-9]{4,6}"))
            g.constrain(Ebnf('root ::= [0-9] [0-9] [0-9]*'))
            return await g.collect_text()

    text = dummy.value(main)
    assert re.fullmatch(r"[0-4]{4,6}", text), text


def test_a_custom_constraint_is_stepped_with_the_tokens_accepted_since(dummy):
    seen: list[list[int]] = []

    class EvenTokens:
        def __init__(self, vocab: int) -> None:
            self.mask = brle.encode(np.arange(vocab) % 2 == 0)

        def step(self, accepted: list[int]) -> list[int]:
            seen.append(list(accepted))
            return self.mask

    async def main(_):
        model = _model()
        with Context(model) as ctx:
            ctx.user("hi")
            g = ctx.generate(Sampler.argmax(), max_tokens=5, stop=[], constrain=EvenTokens(model.vocab_size))
            return await g.collect_tokens()

    tokens = dummy.value(main)
    assert all(t % 2 == 0 for t in tokens)
    assert seen == [[]] + [[t] for t in tokens[:-1]]


def test_a_constraint_that_allows_no_token_is_an_error_and_keeps_the_context(dummy):
    class WrongLength:
        def step(self, accepted: list[int]) -> list[int]:
            return [10]  # a BRLE over 10 tokens, not the vocabulary

    async def disjoint(_):
        with Context(_model()) as ctx:
            ctx.user("x")
            before = ctx.buffer()
            g = ctx.generate(Sampler.argmax(), max_tokens=5, constrain=[Regex("[0-9]+"), Regex("[a-z]+")])
            try:
                await g.collect_tokens()
            except Exception as e:
                assert ctx.buffer()[: len(before)] == before  # nothing ran, nothing lost
                raise e

    message = dummy.error(disjoint)
    assert message.startswith("InvalidInput") and "allow no token after 0 accepted tokens" in message

    async def wrong_length(_):
        with Context(_model()) as ctx:
            ctx.user("x")
            await ctx.generate(Sampler.argmax(), max_tokens=5, constrain=WrongLength()).collect_tokens()

    assert "BRLE covers 10 entries" in dummy.error(wrong_length)


def test_generation_ends_when_the_grammar_ends_even_without_stop_tokens(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("x")
            g = ctx.generate(Sampler.argmax(), max_tokens=20, stop=[], constrain=Regex("(yes|no)"))
            tokens = await g.collect_tokens()
            return tokens, g.is_done, host_model.stop_tokens(ctx.model.name)

    tokens, done, stops = dummy.value(main)
    assert done and len(tokens) < 20 and tokens[-1] in stops


def test_accept_drops_tokens_the_constraints_forbid(dummy):
    async def main(_):
        model = _model()
        tok = model.tokenizer()
        with Context(model) as ctx:
            ctx.user("x")
            g = ctx.generate(Sampler.argmax(), max_tokens=10, constrain=Regex("[0-9]+"))
            kept = g.accept(tok.encode("12") + tok.encode("a") + tok.encode("3"))
            return [tok.decode([t]) for t in kept], g.tokens_generated

    assert dummy.value(main) == (["1", "2"], 2)


def test_schemas_build_fresh_constraints_and_bad_arguments_are_type_errors(dummy):
    async def main(_):
        model = _model()
        a, b = JsonSchema('{"type": "integer"}').build_constraint(model), AnyJson().build_constraint(model)
        assert isinstance(a, GrammarConstraint) and a is not JsonSchema('{"type": "integer"}').build_constraint(model)
        errors = []
        with Context(model) as ctx:
            for bad in ("[0-9]+", 42):
                try:
                    ctx.generate(Sampler.argmax(), constrain=bad)
                except TypeError as e:
                    errors.append(str(e))
            return isinstance(b, GrammarConstraint), errors, ctx.buffer()

    built, errors, buffer = dummy.value(main)
    assert built and len(errors) == 2 and all("constrain= takes a Schema" in e for e in errors)
    assert buffer == []  # a rejected generator cues nothing


def test_matcher_api_walks_a_grammar(dummy):
    async def main(_):
        model = _model()
        tok = model.tokenizer()
        m = Matcher(Grammar.from_regex("(cat|dog)s?"), tok)
        await m.ready()
        m.accept_tokens(tok.encode("cat"))
        runs = m.next_token_logit_mask()
        allowed = np.flatnonzero(brle.decode(runs, model.vocab_size))
        done_before = m.is_completed
        stop = host_model.stop_tokens(model.name)[0]
        m.accept_tokens([stop])
        terminated = m.is_terminated
        m.reset()
        twin = m.fork()
        m.accept_tokens(tok.encode("dog"))
        step_mask = GrammarConstraint(twin).step(tok.encode("ca"))
        return ([tok.decode([int(t)]) for t in allowed], done_before, terminated, m.is_terminated,
                len(step_mask) > 0)

    allowed, done_before, terminated, after_reset, stepped = dummy.value(main)
    assert "s" in allowed and done_before and terminated and not after_reset and stepped


def test_matcher_accept_violation_is_reported_to_the_inferlet(dummy):
    async def main(_):
        model = _model()
        m = Matcher(Grammar.from_json_schema({"type": "boolean"}), model)
        m.accept_tokens(model.tokenizer().encode("maybe"))

    message = dummy.error(main)
    assert message.startswith("InvalidInput: token") and "not allowed by the JSON schema" in message


def test_a_too_short_compile_timeout_fails_the_step_not_the_engine(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.user("x")
            c = GrammarConstraint.from_json_schema(heavy_schema(), ctx.model, compile_timeout=0.01)
            await ctx.generate(Sampler.argmax(), max_tokens=5, constrain=c).collect_tokens()

    assert "did not compile within 0.01 s" in dummy.error(main)
