"""Grammar sources are validated when built; bad input is an InvalidInput that says what is wrong."""

from __future__ import annotations

import pytest

from pie_core.errors import InvalidInput
from pie_core.grammar import source
from inferlet import Ebnf, Grammar, JsonSchema, Regex

LARK_ARITHMETIC = r"""
start: expr
?expr: term (("+" | "-") term)*
?term: factor (("*" | "/") factor)*
?factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""


def test_each_constructor_gives_its_kind():
    assert Grammar.from_json_schema('{"type": "integer"}').kind == "json_schema"
    assert Grammar.from_json_schema({"type": "integer"}) == Grammar.from_json_schema('{"type": "integer"}')
    assert Grammar.json().kind == "json"
    assert Grammar.from_regex("[0-9]+").kind == "regex"
    assert Grammar.from_ebnf('root ::= "a" | "b"').kind == "gbnf"
    assert Grammar.from_ebnf(LARK_ARITHMETIC).kind == "lark"


def test_ebnf_dialect_is_recognised_by_the_rule_operator():
    assert source.is_gbnf('root ::= [0-9]+\nother ::= "x"')
    assert source.is_gbnf('  digits-list ::= [0-9]')
    assert not source.is_gbnf('start: "a"\n// a comment with ::= inside a line')
    assert not source.is_gbnf(LARK_ARITHMETIC)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: Grammar.from_json_schema('{"type": "object", '), "JSON schema is not valid JSON"),
        (lambda: Grammar.from_json_schema('[1, 2]'), "must be a JSON object"),
        (lambda: Grammar.from_json_schema({"type": "objekt"}), 'invalid JSON schema: Unsupported type "objekt"'),
        (lambda: Grammar.from_json_schema({"$ref": "#/definitions/missing"}), "invalid JSON schema"),
        (lambda: JsonSchema('{"type": '), "not valid JSON"),
        (lambda: Grammar.from_regex("[a-"), "invalid regex '[a-': Regex parsing error at position 4: Unclosed '['"),
        (lambda: Regex("(?<=a)b"), "Lookbehind is not supported"),
        (lambda: Grammar.from_ebnf('root ::= [0-9+ ("x"'), "invalid GBNF grammar"),
        (lambda: Grammar.from_ebnf("start: expr\nexpr: undefined_rule"), "invalid Lark grammar"),
        (lambda: Ebnf("start: foo"), "unknown name 'foo'"),
        (lambda: Grammar.from_ebnf("   "), "non-empty"),
    ],
)
def test_bad_grammars_raise_a_clear_invalid_input(build, expected):
    with pytest.raises(InvalidInput) as err:
        build()
    message = str(err.value)
    assert expected in message
    assert ".cc:" not in message and "Check failed" not in message  # no C++ internals


def test_xgrammar_error_prefix_is_removed():
    raw = RuntimeError("[06:43:04] /project/cpp/regex_converter.cc:83: Regex parsing error at position 4: x\n")
    assert source.clean_error(raw) == "Regex parsing error at position 4: x"


def test_sources_are_hashable_values():
    a, b = source.regex("[0-9]+"), source.regex("[0-9]+")
    assert a == b and hash(a) == hash(b)
    assert source.json_schema({"type": "string"}) != source.json_schema({"type": "string"}, whitespace=True)
