"""The in-process host transport: an inferlet's host calls are the engine's own functions.

``pie run`` (and every in-process inferlet of ``pie serve --isolation inprocess``) runs inferlets
as tasks on the engine's event loop, so a call is a direct call of
``pie_core.host.<interface>.<name>``. The declared function checked the arguments against the
declaration before the call got here, as in every runner (:mod:`inferlet.host.arguments`);
nothing is converted or checked again (the caller is trusted code in the engine's process, and
handle kinds are left to the functions). The instance a call serves is the one bound to the
calling task (:func:`pie_core.host.binding.current`).
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from inferlet.host import entry
from inferlet.host import transport as _transport
from pie_core.runtime import host_api

__all__ = ["InProcessTransport", "install"]

_CALLS = host_api.CALLS
_log = logging.getLogger(__name__)


class InProcessTransport:
    """Calls the engine's implementation of each declared function directly."""

    blocking = None  # inferlets share the engine's loop: nothing may block it

    def __init__(self) -> None:
        self._functions: dict[tuple[str, str], Callable[..., Any]] = host_api.host_functions()

    def call(self, key: tuple[str, str], args: tuple[Any, ...]) -> Any:
        _CALLS[key] += 1
        return self._functions[key](*args)

    def call_async(self, key: tuple[str, str], args: tuple[Any, ...]) -> Awaitable[Any]:
        _CALLS[key] += 1
        return self._functions[key](*args)

    def tell(self, key: tuple[str, str], args: tuple[Any, ...]) -> None:
        _CALLS[key] += 1
        try:
            self._functions[key](*args)
        except Exception:  # noqa: BLE001 - a one-way call's failure is the host's to report
            _log.exception("one-way host call %s.%s failed", *key)


def install() -> None:
    """Make the in-process transport this process's, unless a transport is installed already
    (a process that runs inferlets in-process runs no other kind; a test may have installed its
    own to observe or override calls)."""
    if _transport.installed() is None:
        entry.install(InProcessTransport())
