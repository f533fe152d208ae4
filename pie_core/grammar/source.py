"""Grammar sources: what a constraint is written in, validated, before any tokenizer is involved.

A :class:`GrammarSource` is a small hashable value (its kind and its text), so compiled grammars
can be cached per (source, tokenizer). Building one parses it with ``xgrammar`` right away, so a
malformed schema, regex or grammar is an :class:`~pie_core.errors.InvalidInput` at construction
time, not a failure somewhere inside a generation.

EBNF comes in two dialects, both compiled by ``xgrammar`` itself:

- **GBNF** (llama.cpp's EBNF): rules written ``name ::= ...``, the start rule is ``root``.
- **Lark**: rules written ``name: ...``, the start rule is ``start``; ``%import common.X`` and
  ``%ignore`` work.

A source in which some line starts a rule with ``::=`` is read as GBNF, anything else as Lark.

Sources are bounded before xgrammar sees them, since parsing runs where the caller runs (for a
worker's call, on the engine's event loop) and its cost grows fast with nesting: a source's text
is at most :data:`MAX_SOURCE_BYTES` and a JSON schema or structural tag nests at most
:data:`MAX_JSON_DEPTH` containers deep.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Mapping

from pie_core.grammar.lazy_xgr import xgr

from inferlet.host.types import GrammarKind, GrammarSource
from pie_core.errors import InvalidInput

__all__ = [
    "GrammarKind",
    "GrammarSource",
    "build",
    "json_schema",
    "any_json",
    "regex",
    "ebnf",
    "structural_tag",
    "is_gbnf",
    "MAX_SOURCE_BYTES",
    "MAX_JSON_DEPTH",
    "check_json_bounds",
]

MAX_SOURCE_BYTES = 128 * 2**10
"""Largest grammar text (schema, pattern or EBNF) in UTF-8 bytes."""

MAX_JSON_DEPTH = 32
"""Deepest nesting of objects and arrays in a JSON schema or structural tag (a 200-deep schema
takes xgrammar seconds to parse, 400 deep a quarter of a minute)."""

_GBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w.-]*\s*::=", re.M)
_XGR_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+?:\d+:\s*")  # "[06:43:04] /project/cpp/x.cc:106: "


def build(source: GrammarSource) -> xgr.Grammar:
    """The parsed ``xgrammar.Grammar`` of ``source`` (memoised).

    Raises:
        InvalidInput: The text does not parse; the message says where.
    """
    return _build(source)


def json_schema(schema: str | Mapping[str, Any] | bool, whitespace: bool = False) -> GrammarSource:
    """A source for JSON conforming to ``schema`` (a JSON Schema as text or as a dict).

    Raises:
        InvalidInput: ``schema`` is not valid JSON, not an object (or boolean), or uses a type,
            reference or keyword combination xgrammar cannot turn into a grammar.
    """
    if isinstance(schema, (str, bytes)):
        _check_size(schema, "JSON schema")
        value = _loads(schema, "JSON schema")
    else:
        value = schema
    if not isinstance(value, (dict, bool)):
        raise InvalidInput(f"a JSON schema must be a JSON object (or true/false), got {type(value).__name__}")
    _check_depth(value, "JSON schema")
    try:
        text = json.dumps(value, sort_keys=False, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"JSON schema cannot be encoded as JSON: {e}") from None
    _check_size(text, "JSON schema")
    return _checked(GrammarSource("json_schema", text, whitespace))


def any_json(whitespace: bool = False) -> GrammarSource:
    """A source for any JSON value: on one line with ``", "`` and ``": "`` separators, or with
    ``whitespace=True`` xgrammar's built-in JSON grammar (any whitespace between tokens)."""
    return GrammarSource("json", "", whitespace)


def regex(pattern: str) -> GrammarSource:
    """A source for strings that match ``pattern`` in full.

    Raises:
        InvalidInput: The pattern does not parse or uses a feature xgrammar lacks (lookbehind,
            backreferences).
    """
    if not isinstance(pattern, str):
        raise InvalidInput(f"a regex must be a string, got {type(pattern).__name__}")
    _check_size(pattern, "regex")
    return _checked(GrammarSource("regex", pattern))


def ebnf(text: str) -> GrammarSource:
    """A source for a GBNF (``root ::= ...``) or Lark (``start: ...``) grammar.

    Raises:
        InvalidInput: The grammar has a syntax error or references an undefined rule.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("an EBNF grammar must be a non-empty string")
    _check_size(text, "EBNF grammar")
    return _checked(GrammarSource("gbnf" if is_gbnf(text) else "lark", text))


def structural_tag(tag_json: str) -> GrammarSource:
    """A source for an xgrammar structural tag (JSON), e.g. a model's tool-call format.

    Raises:
        InvalidInput: The tag is malformed.
    """
    if not isinstance(tag_json, str):
        raise InvalidInput(f"a structural tag must be JSON text, got {type(tag_json).__name__}")
    _check_size(tag_json, "tool-call grammar")
    _check_depth(_loads(tag_json, "tool-call grammar"), "tool-call grammar")
    return _checked(GrammarSource("structural_tag", tag_json))


def is_gbnf(text: str) -> bool:
    """Whether ``text`` reads as GBNF (some line starts a rule with ``::=``) rather than Lark."""
    return _GBNF_RULE.search(text) is not None


def _check_size(text: str | bytes, what: str) -> None:
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise InvalidInput(f"a {what} may be at most {MAX_SOURCE_BYTES} bytes, got {size}; "
                           "split it, or share repeated parts through $defs/$ref or rules")


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidInput(f"a {what} may nest at most {MAX_JSON_DEPTH} objects and arrays deep") from None
    except ValueError as e:
        raise InvalidInput(f"{what} is not valid JSON: {e}") from None


def _check_depth(value: Any, what: str) -> None:
    """Refuse JSON nested deeper than :data:`MAX_JSON_DEPTH` or with more values than its text
    could hold (walked without recursion and counted, so neither a dict nested a million deep
    nor one that shares a child many times over costs more than the bound)."""
    stack, budget = [(value, 1)], MAX_SOURCE_BYTES // 2  # every JSON value takes at least two bytes with its separator
    while stack:
        item, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise InvalidInput(f"a {what} may be at most {MAX_SOURCE_BYTES} bytes as JSON; it holds more values than fit")
        if not isinstance(item, (dict, list, tuple)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise InvalidInput(f"a {what} may nest at most {MAX_JSON_DEPTH} objects and arrays deep; "
                               "flatten it, or share repeated parts through $defs/$ref")
        stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))


def check_json_bounds(value: Any, what: str) -> None:
    """Refuse a JSON value that nests deeper than :data:`MAX_JSON_DEPTH` or holds more than
    :data:`MAX_SOURCE_BYTES` of JSON (counted without building the text).

    Raises:
        InvalidInput: Over either bound.
    """
    _check_depth(value, what)
    stack, size = [value], 0
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
            size += sum(len(k) + 4 for k in item if isinstance(k, str)) + 2
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
            size += 2
        else:
            size += len(item) + 2 if isinstance(item, str) else 8
        if size > MAX_SOURCE_BYTES:
            raise InvalidInput(f"a {what} may be at most {MAX_SOURCE_BYTES} bytes as JSON; it holds more")


def _checked(source: GrammarSource) -> GrammarSource:
    build(source)
    return source


@functools.lru_cache(maxsize=256)
def _build(source: GrammarSource) -> xgr.Grammar:
    try:
        if source.kind == "json_schema":
            return xgr.Grammar.from_json_schema(source.text, any_whitespace=source.whitespace, strict_mode=True)
        if source.kind == "json":
            if source.whitespace:
                return xgr.Grammar.builtin_json_grammar()
            return xgr.Grammar.from_json_schema("{}", any_whitespace=False)
        if source.kind == "regex":
            return xgr.Grammar.from_regex(source.text)
        if source.kind == "gbnf":
            return xgr.Grammar.from_ebnf(source.text)
        if source.kind == "lark":
            return xgr.Grammar.from_lark(source.text)
        if source.kind == "structural_tag":
            return xgr.Grammar.from_structural_tag(source.text)
    except (RuntimeError, ValueError, TypeError) as e:
        raise InvalidInput(f"invalid {source.describe()}: {clean_error(e)}") from None
    raise InvalidInput(f"unknown grammar kind {source.kind!r}")


def clean_error(error: BaseException) -> str:
    """xgrammar's error text without its timestamp and C++ file prefix."""
    lines = [_XGR_PREFIX.sub("", line) for line in str(error).strip().splitlines()]
    text = "\n".join(line for line in lines if line.strip())
    return text.replace("Check failed: (error.empty()) is false: ", "")
