"""How each model family writes tool calls: the syntax, parsing it, and normalising tool schemas.

Families and their call syntax (what the model writes in its reply, as its template shows it):

- Qwen 2.5 and Qwen 3 (ChatML): ``<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>``,
  one block per call, several calls per reply allowed. Qwen 3 may think first (``<think>``).
- Llama 3.x: a bare JSON object ``{"name": N, "parameters": {...}}`` as the reply.

Formats without a known syntax (Gemma, template-driven ones) have none: callers fall back to
free-form generation and their own parsing.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from inferlet.host.types import ToolCallSyntax
from pie_core.errors import InvalidInput
from pie_core.models.chat_formats.base import ChatFormat

__all__ = ["ToolCallSyntax", "tool_call_syntax", "normalize_tools", "parse_tool_calls", "format_tool_call"]


QWEN = ToolCallSyntax("qwen", "<tool_call>", "</tool_call>", "arguments")
QWEN3 = ToolCallSyntax("qwen", "<tool_call>", "</tool_call>", "arguments", reasoning=True)
LLAMA3 = ToolCallSyntax("llama", "", "", "parameters")


def tool_call_syntax(fmt: ChatFormat) -> ToolCallSyntax | None:
    """The tool-call syntax of a chat format, or None when it has no known one."""
    if fmt.name in ("chatml", "qwen3") and fmt.tool_call_markers == ("<tool_call>", "</tool_call>"):
        return QWEN3 if fmt.name == "qwen3" else QWEN
    if fmt.name == "llama3":
        return LLAMA3
    return None


def normalize_tools(schemas: Iterable[Any]) -> list[dict[str, Any]]:
    """Tool schemas in the OpenAI shape templates expect: ``{"type": "function", "function": {...}}``.

    Each schema may be a dict or its JSON text, either already in that shape or a bare function
    description ``{"name": ..., "description": ..., "parameters": {...}}`` (which gets wrapped).

    Raises:
        InvalidInput: A schema that is not JSON, has no string ``name``, has non-object
            ``parameters``, or two tools with one name.
    """
    if isinstance(schemas, (str, bytes, dict)):
        raise InvalidInput("tool schemas must be a list (of dicts or JSON strings), one per tool")
    tools: list[dict[str, Any]] = []
    for i, schema in enumerate(schemas):
        value = schema
        if isinstance(schema, (str, bytes)):
            try:
                value = json.loads(schema)
            except ValueError as e:
                raise InvalidInput(f"tool schema {i} is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise InvalidInput(f"tool schema {i} must be a JSON object, got {type(value).__name__}")
        function = value.get("function") if value.get("type") == "function" else value
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidInput(f"tool schema {i} needs a non-empty string 'name' (or 'function': {{'name': ...}})")
        params = function.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidInput(f"tool {function['name']!r}: 'parameters' must be a JSON schema object")
        tools.append(value if value.get("type") == "function" else {"type": "function", "function": function})
    names = [t["function"]["name"] for t in tools]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InvalidInput(f"two tools are named {dup!r}; tool names must be unique")
    return tools


def format_tool_call(syntax: ToolCallSyntax, name: str, args: Any) -> str:
    """The text of one call as the family's template writes it in an assistant turn."""
    body = json.dumps({"name": name, syntax.args_key: args}, ensure_ascii=False)
    return f"{syntax.begin}\n{body}\n{syntax.end}" if syntax.begin else body


def parse_tool_calls(syntax: ToolCallSyntax, text: str) -> list[tuple[str, str]]:
    """Every complete tool call in ``text``, as ``(name, JSON-encoded arguments)`` in order.

    Qwen style reads each ``<tool_call>...</tool_call>`` block (an unclosed last block is not a
    call yet); Llama style reads every JSON object that has ``name`` and ``parameters``.

    Raises:
        InvalidInput: A closed Qwen block whose content is not a JSON object with a string
            ``name`` and object ``arguments``.
    """
    if syntax.style == "qwen":
        return [_qwen_call(syntax, block) for block in _blocks(text, syntax.begin, syntax.end)]
    return _bare_calls(syntax, text)


def _blocks(text: str, begin: str, end: str) -> list[str]:
    blocks = []
    at = text.find(begin)
    while at >= 0:
        close = text.find(end, at + len(begin))
        if close < 0:
            break
        blocks.append(text[at + len(begin) : close])
        at = text.find(begin, close + len(end))
    return blocks


def _qwen_call(syntax: ToolCallSyntax, block: str) -> tuple[str, str]:
    try:
        value = json.loads(block)
    except ValueError as e:
        raise InvalidInput(f"a {syntax.begin} block is not valid JSON ({e}): {block.strip()[:200]!r}") from None
    return _call(syntax, value, block)


def _call(syntax: ToolCallSyntax, value: Any, raw: str) -> tuple[str, str]:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise InvalidInput(f"a tool call needs a JSON object with a string 'name': {raw.strip()[:200]!r}")
    args = value.get(syntax.args_key, {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            pass
    if not isinstance(args, dict):
        raise InvalidInput(f"tool call {value['name']!r}: '{syntax.args_key}' must be a JSON object")
    return value["name"], json.dumps(args, ensure_ascii=False)


def _bare_calls(syntax: ToolCallSyntax, text: str) -> list[tuple[str, str]]:
    decoder = json.JSONDecoder()
    calls = []
    at = text.find("{")
    while at >= 0:
        try:
            value, stop = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str) and syntax.args_key in value:
            calls.append(_call(syntax, value, text[at:stop]))
            at = text.find("{", stop)
        else:
            at = text.find("{", at + 1)
    return calls
