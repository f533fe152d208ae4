"""The errors a host call raises, as inferlets and the engine both see them.

Standard library only: the same classes exist in every runner (the engine re-exports them from
``pie_core.errors``, the process worker and the wasm guest import them from here), so ``except
InvalidInput`` catches the engine's error wherever the inferlet runs. Each class maps to one
client-visible error kind (:attr:`PieError.kind`).
"""

from __future__ import annotations

__all__ = ["PieError", "InvalidInput", "OutOfPages", "Unsupported", "NotFound", "BackendError", "ContractError",
           "McpError"]


class PieError(Exception):
    """Base of every error the engine raises on purpose."""

    kind = "error"


class InvalidInput(PieError, ValueError):
    """The caller passed something malformed: fix the argument named in the message."""

    kind = "invalid_input"


class OutOfPages(PieError):
    """The KV page pool cannot satisfy an allocation."""

    kind = "out_of_pages"


class Unsupported(PieError):
    """The backend, or the runner, lacks what a request needs: the message says what instead."""

    kind = "unsupported"


class NotFound(PieError, LookupError):
    """A named model, backend, inferlet or snapshot does not exist."""

    kind = "not_found"


class BackendError(PieError):
    """The backend failed while running a batch."""

    kind = "backend_error"


class ContractError(PieError):
    """A backend plugin does not satisfy the hook spec or its contract version."""

    kind = "contract_error"


class McpError(PieError):
    """An MCP server failed: it could not start, it exited, it timed out, it answered a request
    with an error, or a tool it ran reported a failure. The message names the server and says
    what to check."""

    kind = "mcp_error"
