"""Route ``print()``/``sys.stdout`` and ``sys.stderr`` writes made inside an inferlet's task to
that inferlet's Stdout and Stderr events; writes from any other task or thread go through.

Stdout is line-buffered per instance: one Stdout event per complete line (its ``\\n``
included), a partial line on ``flush()`` or when the inferlet ends (:func:`flush_stdout`), and
at most 64 KiB of text per event. Stderr sends each write as one Stderr event. Isolated workers
do the same (:mod:`pie_core.runtime.process.worker`).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, TextIO

from pie_core.engine.events import Event
from pie_core.host.binding import HostInstance, _current, emitting

__all__ = ["install_stdio_router", "flush_stdout"]

_CHUNK = 64 * 1024


class _Router:
    """A ``sys.stdout``/``sys.stderr`` stand-in: inside a bound task it emits, elsewhere it writes through."""

    def __init__(self, real: TextIO, kind: str) -> None:
        self._real, self._kind = real, kind
        self._pending: weakref.WeakKeyDictionary[HostInstance, str] = weakref.WeakKeyDictionary()

    def write(self, text: str) -> int:
        inst = _current.get()
        if inst is None or emitting():  # an event handler's own output goes through
            return self._real.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._kind == "stderr":
            self._emit(inst, text)
            return len(text)
        buf = self._pending.pop(inst, "") + text
        cut = buf.rfind("\n") + 1 or (len(buf) if len(buf) >= _CHUNK else 0)
        self._emit(inst, buf[:cut])
        if cut < len(buf):
            self._pending[inst] = buf[cut:]
        return len(text)

    def flush(self) -> None:
        inst = _current.get()
        if inst is not None and not emitting():
            self.flush_instance(inst)
        else:
            self._real.flush()

    def flush_instance(self, inst: HostInstance) -> None:
        self._emit(inst, self._pending.pop(inst, ""))

    def _emit(self, inst: HostInstance, text: str) -> None:
        for i in range(0, len(text), _CHUNK):
            inst.emit(Event(self._kind, text[i:i + _CHUNK]))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def install_stdio_router() -> None:
    """Install the routers on ``sys.stdout`` and ``sys.stderr`` once (idempotent)."""
    if not isinstance(sys.stdout, _Router):
        sys.stdout = _Router(sys.stdout, "stdout")  # type: ignore[assignment]
    if not isinstance(sys.stderr, _Router):
        sys.stderr = _Router(sys.stderr, "stderr")  # type: ignore[assignment]


def flush_stdout(inst: HostInstance) -> None:
    """Emit ``inst``'s pending partial stdout line, if any (call before its terminal event)."""
    if isinstance(sys.stdout, _Router):
        sys.stdout.flush_instance(inst)
