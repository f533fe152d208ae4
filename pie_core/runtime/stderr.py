"""Route ``sys.stderr`` writes made inside an inferlet's task to that inferlet's Stderr events."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from pie_core.host.binding import _current
from pie_core.runtime.events import Event

__all__ = ["install_stderr_router"]


class _StderrRouter:
    """A ``sys.stderr`` stand-in: inside a bound task it emits, elsewhere it writes through."""

    def __init__(self, real: TextIO) -> None:
        self._real = real
        self._emitting = False  # an emit handler that itself writes to stderr goes through

    def write(self, text: str) -> int:
        inst = _current.get()
        if inst is None or self._emitting:
            return self._real.write(text)
        if text:
            self._emitting = True
            try:
                inst.emit(Event("stderr", text))
            finally:
                self._emitting = False
        return len(text)

    def flush(self) -> None:
        self._real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def install_stderr_router() -> None:
    """Install the router once (idempotent)."""
    if not isinstance(sys.stderr, _StderrRouter):
        sys.stderr = _StderrRouter(sys.stderr)  # type: ignore[assignment]
