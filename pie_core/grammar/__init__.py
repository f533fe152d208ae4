"""Structured generation on xgrammar: grammar sources, compilation, matchers and packed masks.

- :mod:`~pie_core.grammar.source`: validated grammar sources (JSON Schema, any JSON, regex,
  GBNF or Lark EBNF, structural tags), hashable so compiled grammars can be cached.
- :mod:`~pie_core.grammar.vocab`: the model's vocabulary as xgrammar's ``TokenizerInfo``.
- :mod:`~pie_core.grammar.compiler`: per-vocabulary compilation, cached, in worker threads,
  under a time limit.
- :mod:`~pie_core.grammar.matcher`: stateful matchers producing packed vocabulary masks.
- :mod:`~pie_core.grammar.tool_calls`: grammars over a family's native tool-call syntax.

Inferlets reach all of this through :mod:`pie_core.host.grammar` and :mod:`pie_core.host.tools`.
"""

from pie_core.grammar.compiler import DEFAULT_TIMEOUT_S, GrammarCompiler, compiler_for
from pie_core.grammar.matcher import Matcher
from pie_core.grammar.source import GrammarSource, any_json, ebnf, json_schema, regex, structural_tag
from pie_core.grammar.tool_calls import tool_call_source

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "GrammarCompiler",
    "GrammarSource",
    "Matcher",
    "any_json",
    "compiler_for",
    "ebnf",
    "json_schema",
    "regex",
    "structural_tag",
    "tool_call_source",
]
