"""The error hierarchy. Each class maps to one client-visible error kind."""

from __future__ import annotations

__all__ = [
    "PieError",
    "InvalidInput",
    "OutOfPages",
    "Unsupported",
    "NotFound",
    "BackendError",
    "ContractError",
]


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
    """The backend did not declare the capability a request needs."""

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
