"""The error an MCP call raises, and the check that turns a failed tool call into one."""

from __future__ import annotations

from typing import Any, Mapping

from pie_core.errors import McpError

__all__ = ["McpError", "check_tool_result"]


def check_tool_result(server: str, tool: str, result: Mapping[str, Any]) -> None:
    """Raise when a ``tools/call`` result is flagged ``isError``.

    Raises:
        McpError: Carrying the text the tool returned.
    """
    if not result.get("isError"):
        return
    texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, Mapping) and c.get("type") == "text"]
    detail = "; ".join(t for t in texts if t) or "no message"
    raise McpError(f"tool {tool!r} on MCP server {server!r} failed: {detail}")
