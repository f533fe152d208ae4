"""Host interface ``tools``: tool schemas in a model's chat format, its call syntax and grammar."""

from __future__ import annotations

from typing import Any, Iterable

from pie_core.errors import Unsupported
from pie_core.grammar.source import GrammarSource
from pie_core.grammar.tool_calls import tool_call_source
from pie_core.host.binding import any_thread, off_loop
from pie_core.host.model import resolve
from pie_core.models.chat_formats.tool_calls import (
    ToolCallSyntax,
    format_tool_call,
    normalize_tools,
    parse_tool_calls,
    tool_call_syntax,
)

__all__ = [
    "ToolCallSyntax",
    "normalize",
    "syntax",
    "equip_prefix",
    "answer_prefix",
    "parse_calls",
    "format_call",
    "call_grammar",
]


@any_thread
def normalize(schemas: Iterable[Any]) -> list[dict[str, Any]]:
    """Tool schemas (dicts or JSON strings) in the ``{"type": "function", "function": ...}`` shape.

    Raises:
        InvalidInput: A schema without a name, non-object parameters, or a duplicate name.
    """
    return normalize_tools(schemas)


@any_thread
def syntax(name: str) -> ToolCallSyntax | None:
    """How model ``name`` writes tool calls, or None when its chat format has no known syntax."""
    return tool_call_syntax(resolve(name).chat)


@any_thread
def equip_prefix(name: str, schemas: Iterable[Any], system: str | None = None) -> list[int]:
    """Tokens that open a conversation listing the tools, exactly as the model's template does.

    Args:
        name: Model name.
        schemas: Tool schemas (see :func:`normalize`).
        system: System text to go with the tools (default: the template's own).

    Raises:
        Unsupported: The model's chat template has no tool support.
        InvalidInput: Malformed schemas.
    """
    return list(resolve(name).chat.equip(normalize_tools(schemas), system))


@any_thread
def answer_prefix(name: str, tool: str, value: Any) -> list[int]:
    """Tokens of a turn carrying tool ``tool``'s result ``value`` (non-strings JSON-encoded).

    Raises:
        Unsupported: The model's chat template has no tool support.
    """
    return list(resolve(name).chat.answer(tool, value))


@any_thread
def parse_calls(name: str, text: str) -> list[tuple[str, str]]:
    """Complete tool calls in ``text`` as ``(tool name, JSON arguments)``; [] without a syntax.

    Raises:
        InvalidInput: A closed call block that is not valid JSON.
    """
    found = syntax(name)
    return [] if found is None else parse_tool_calls(found, text)


@any_thread
def format_call(name: str, tool: str, args: Any) -> str:
    """The text of a call to ``tool`` as model ``name``'s template writes it.

    Raises:
        Unsupported: The model has no known tool-call syntax.
    """
    found = syntax(name)
    if found is None:
        raise Unsupported(f"model {name!r} has no known tool-call syntax")
    return format_tool_call(found, tool, args)


@any_thread
@off_loop  # xgrammar converts each parameters schema (seconds for a long pattern): never on the loop
def call_grammar(name: str, schemas: Iterable[Any], choice: str = "auto") -> GrammarSource | None:
    """A grammar over model ``name``'s native tool-call syntax for these tools, or None.

    Args:
        name: Model name.
        schemas: Tool schemas.
        choice: ``"auto"``, ``"required"`` or a tool name (see
            :func:`pie_core.grammar.tool_calls.tool_call_source`).

    Raises:
        InvalidInput: Malformed schemas or an unknown ``choice``.
    """
    found = syntax(name)
    return None if found is None else tool_call_source(found, normalize_tools(schemas), choice)
