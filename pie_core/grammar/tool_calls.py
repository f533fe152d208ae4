"""Grammars over a model family's native tool-call syntax, from xgrammar's structural tags.

xgrammar ships structural tags for the families' tool-call formats
(``xgrammar.get_model_structural_tag``): with ``choice="auto"`` the model may write free text,
and whenever it starts a call (``<tool_call>`` for Qwen, ``{"name": `` for Llama) the call is
held to one of the tools, its arguments to that tool's ``parameters`` schema. ``"required"``
asks for at least one call; a tool's name forces a call to that tool.
"""

from __future__ import annotations

from typing import Any

from pie_core.grammar.lazy_xgr import xgr

from pie_core.errors import InvalidInput
from pie_core.grammar.source import GrammarSource, check_json_bounds, clean_error, structural_tag
from pie_core.models.chat_formats.tool_calls import ToolCallSyntax

__all__ = ["tool_call_source"]

_FAMILY = {"qwen": "qwen_3", "llama": "llama"}

MAX_WHITESPACE = 16
"""Longest whitespace run between the JSON tokens of a call's arguments (room for indented JSON,
none for a model stuck emitting blank space)."""


def tool_call_source(syntax: ToolCallSyntax, tools: list[dict[str, Any]], choice: str = "auto") -> GrammarSource:
    """A grammar for replies in ``syntax`` calling ``tools``.

    Args:
        syntax: The family's tool-call syntax.
        tools: Normalised tool schemas (``{"type": "function", "function": {...}}``).
        choice: ``"auto"`` (text or calls), ``"required"`` (at least one call), or the name
            of one tool (exactly a call to it).

    Raises:
        InvalidInput: No tools, an unknown tool name in ``choice``, or a tool whose parameters
            schema xgrammar cannot compile.
    """
    if not tools:
        raise InvalidInput("a tool-call grammar needs at least one tool")
    check_json_bounds(tools, "tool list")  # before xgrammar reads a byte of it
    names = [t["function"]["name"] for t in tools]
    if choice in ("auto", "required"):
        tool_choice: Any = choice
    elif choice in names:
        tool_choice = {"type": "function", "function": {"name": choice}}
    else:
        raise InvalidInput(f"choice must be 'auto', 'required' or a tool name ({', '.join(names)}), got {choice!r}")
    try:
        tag = xgr.get_model_structural_tag(
            _FAMILY[syntax.style],
            tools=list[Any](tools),
            tool_choice=tool_choice,
            reasoning="auto" if syntax.reasoning else "disabled",
            max_whitespace_cnt=MAX_WHITESPACE,
        )
    except (ValueError, TypeError, RuntimeError) as e:
        raise InvalidInput(f"cannot build the tool-call grammar: {clean_error(e)}") from None
    return structural_tag(tag.model_dump_json())
