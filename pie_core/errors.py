"""The error hierarchy. Each class maps to one client-visible error kind.

The classes are the SDK's (:mod:`inferlet.host.errors`, standard library only), so an error the
engine raises is the very class an inferlet catches, in every runner.
"""

from __future__ import annotations

from inferlet.host.errors import (BackendError, ContractError, InvalidInput, McpError, NotFound, OutOfPages, PieError,
                                  Unsupported)

__all__ = [
    "PieError",
    "InvalidInput",
    "OutOfPages",
    "Unsupported",
    "NotFound",
    "BackendError",
    "ContractError",
    "McpError",
]
