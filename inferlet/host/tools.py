"""Host interface ``tools``: tool schemas in a model's chat format, its call syntax and grammar."""

from __future__ import annotations

from typing import Any, Iterable

from inferlet.host._declare import host
from inferlet.host.types import Model, GrammarSource, ToolCallSyntax

__all__ = ["answer_prefix", "call_grammar", "equip_prefix", "format_call", "normalize", "parse_calls", "syntax"]


@host
def answer_prefix(name: str, tool: str, value: Any) -> list[int]:
    """Tokens of a turn carrying tool ``tool``'s result ``value`` (non-strings JSON-encoded).

    Raises:
        Unsupported: The model's chat template has no tool support.
    """


@host
def call_grammar(name: str, schemas: Iterable[Any], choice: str = 'auto') -> GrammarSource | None:
    """A grammar over model ``name``'s native tool-call syntax for these tools, or None.

    Args:
        name: Model name.
        schemas: Tool schemas.
        choice: ``"auto"``, ``"required"`` or a tool name (see
            :func:`pie_core.grammar.tool_calls.tool_call_source`).

    Raises:
        InvalidInput: Malformed schemas or an unknown ``choice``.
    """


@host
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


@host
def format_call(name: str, tool: str, args: Any) -> str:
    """The text of a call to ``tool`` as model ``name``'s template writes it.

    Raises:
        Unsupported: The model has no known tool-call syntax.
    """


@host
def normalize(schemas: Iterable[Any]) -> list[dict[str, Any]]:
    """Tool schemas (dicts or JSON strings) in the ``{"type": "function", "function": ...}`` shape.

    Raises:
        InvalidInput: A schema without a name, non-object parameters, or a duplicate name.
    """


@host
def parse_calls(name: str, text: str) -> list[tuple[str, str]]:
    """Complete tool calls in ``text`` as ``(tool name, JSON arguments)``; [] without a syntax.

    Raises:
        InvalidInput: A closed call block that is not valid JSON.
    """


@host
def syntax(name: str) -> ToolCallSyntax | None:
    """How model ``name`` writes tool calls, or None when its chat format has no known syntax."""
