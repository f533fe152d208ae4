"""Constrained generation on the real default model: every reply parses and conforms.

All replies of a test run concurrently in one inferlet, so the engine batches them: one model
load for the whole directory (the ``real`` fixture) and a few dozen decode steps per test.
"""

from __future__ import annotations

import asyncio
import re

import jsonschema
import lark
import pytest
from schemas import TWENTY

from inferlet import Context, Ebnf, Model, Regex, Sampler, runtime

pytestmark = pytest.mark.model

SAMPLED = dict(temperature=0.8, top_p=0.95)

LARK_ARITHMETIC = r"""
start: expr
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""

PATTERNS = {
    "On what date did Apollo 11 land on the Moon?": r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    "Give me a US phone number.": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    "Name a Python variable for a user count.": r"[a-z_][a-z0-9_]{2,15}",
    "Make up an email address.": r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)",
}


def _sampler(greedy: bool, seed: int) -> Sampler:
    return Sampler.argmax() if greedy else Sampler.top_p(SAMPLED["temperature"], SAMPLED["top_p"], seed=seed)


async def _reply(model: Model, prompt: str, greedy: bool, seed: int, max_tokens: int, constraint) -> str:
    with Context(model) as ctx:
        ctx.user(prompt)
        g = ctx.generate(_sampler(greedy, seed), max_tokens=max_tokens, constrain=constraint)
        return await g.collect_text()


def test_twenty_json_schemas_give_valid_json_greedy_and_sampled(real):
    async def main(_):
        model = Model.load(runtime.models()[0])

        async def one(i: int, greedy: bool):
            what, schema = TWENTY[i]
            with Context(model) as ctx:
                ctx.user(f"Reply with JSON only: {what}.")  # the constraint alone holds it to the schema
                g = ctx.generate(_sampler(greedy, 100 + i), max_tokens=48)
                return await g.collect_json(schema=schema)

        jobs = [one(i, greedy) for greedy in (True, False) for i in range(len(TWENTY))]
        return await asyncio.gather(*jobs)

    values = real.value(main)
    assert len(values) == 2 * len(TWENTY)
    for k, value in enumerate(values):
        what, schema = TWENTY[k % len(TWENTY)]
        jsonschema.validate(value, schema)  # raises with the path of the first violation


def test_regex_replies_match_and_lark_replies_parse(real):
    parser = lark.Lark(LARK_ARITHMETIC)

    async def main(_):
        model = Model.load(runtime.models()[0])
        jobs = [_reply(model, q, greedy, 7, 24, Regex(p)) for q, p in PATTERNS.items() for greedy in (True, False)]
        math = "Write an arithmetic expression that equals 12. Reply with the expression only."
        jobs += [_reply(model, math, greedy, 11, 24, Ebnf(LARK_ARITHMETIC)) for greedy in (True, False)]
        return await asyncio.gather(*jobs)

    replies = real.value(main)
    for (question, pattern), pair in zip(PATTERNS.items(), zip(replies[0::2], replies[1::2])):
        for text in pair:
            assert re.fullmatch(pattern, text), (question, text)
    for text in replies[-2:]:
        parser.parse(text)  # raises on a reply outside the grammar
