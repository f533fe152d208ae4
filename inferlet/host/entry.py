"""What every runner does with an inferlet, the same way: install a transport, import the entry
module, run ``main(input)``, check what it returned.

The in-process runner, the process worker and the wasm guest call these, so an inferlet that runs
in one runs in the others with the same errors.
"""

from __future__ import annotations

import importlib.util
import inspect
import io
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Awaitable, Callable

from inferlet import _blocking
from inferlet._main_exit import MAIN_EXITS, exit_outcome
from inferlet._return_value import check_return, encode_return
from inferlet.host import transport as _transport
from inferlet.host.errors import InvalidInput

__all__ = ["install", "load_main", "as_coroutine_function", "check_return", "encode_return", "describe", "WHERE",
           "MAIN_EXITS", "exit_outcome", "ClientStream", "CHUNK"]

WHERE = _blocking.WHERE
"""The end of every error a synchronous form raises where the runner cannot block."""


def install(transport: _transport.Transport) -> None:
    """Make ``transport`` this process's host transport and, where it lets the inferlet block,
    make the first private event loop now (before a sandbox may refuse what that takes)."""
    _transport.install(transport)
    _blocking.prepare()


def load_main(path: str | Path, module_name: str, *, synchronous: bool, own_process: bool) -> Callable[[Any], Any]:
    """Import the inferlet's entry file ``path`` as module ``module_name`` and return its ``main``.

    The entry's folder goes first on ``sys.path`` while it imports, so modules and packages
    vendored beside it import too.

    Args:
        own_process: The inferlet has the interpreter to itself (process, wasm): its folder
            stays on ``sys.path``, so ``main`` may import from it later too.
        synchronous: Also accept a plain ``def main(input)``: only where the transport lets the
            inferlet block (process, wasm).

    Raises:
        InvalidInput: The file cannot be imported as a module, or has no ``async def
            main(input)`` (nor, with ``synchronous``, a ``def main(input)``).
    """
    path = Path(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InvalidInput(f"cannot import {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        if not own_process and folder in sys.path:
            sys.path.remove(folder)
    main = getattr(module, "main", None)
    if main is None or not callable(main):
        raise InvalidInput(f"{path.name} must define 'async def main(input)'")
    if not synchronous and not inspect.iscoroutinefunction(main):
        raise InvalidInput(f"{path.name}: main is a plain function here: write 'async def main(input)' ({WHERE})")
    return main


def as_coroutine_function(main: Callable[[Any], Any]) -> Callable[[Any], Awaitable[Any]]:
    """``main`` as a coroutine function: a plain ``def main(input)`` runs as synchronous code
    (no event loop running), so the SDK's waiting calls in it block and return values."""
    if inspect.iscoroutinefunction(main):
        return main

    async def run(payload: Any) -> Any:
        return _blocking.call_synchronously(main, payload)

    return run


def describe(exc: BaseException) -> str:
    """How an error that ended ``main`` reads in the Error event: ``Class: message``."""
    return f"{type(exc).__name__}: {exc}"


CHUNK = 64 * 1024
"""Characters one Stdout or Stderr event carries at most (in every runner)."""


class ClientStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a sandboxed inferlet: its text becomes the client's
    events, ``send(text)`` sending one.

    Stdout is line-buffered: an event per complete line, a partial line on ``flush()`` (and when
    ``main`` ends: the runner flushes); stderr sends each write. An event carries at most
    :data:`CHUNK` characters, and a line that grows past it goes out in pieces of that size, so
    the buffer stays under it. (In-process, ``pie_core.runtime.stdio`` routes the engine's own
    streams by the same rules.)
    """

    def __init__(self, send: Callable[[str], None], stream: str) -> None:
        super().__init__()
        self._send_one, self._stream, self._buf = send, stream, ""

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._stream == "stderr":
            self._send(text)
            return len(text)
        self._buf += text
        cut = self._buf.rfind("\n") + 1
        if cut or len(self._buf) >= CHUNK:
            cut = cut or len(self._buf)
            line, self._buf = self._buf[:cut], self._buf[cut:]
            self._send(line)
        return len(text)

    def flush(self) -> None:
        line, self._buf = self._buf, ""
        self._send(line)

    def _send(self, text: str) -> None:
        for i in range(0, len(text), CHUNK):
            self._send_one(text[i:i + CHUNK])
