"""``sys.exit()`` and ``KeyboardInterrupt`` in an inferlet: how they end its run, the same way in
every runner (stdlib only, so the wasm guest imports it too).

They end the inferlet, never the server: as in a Python program, ``sys.exit()``,
``sys.exit(None)`` and ``sys.exit(0)`` mean success, so the run ends as if ``main`` returned
None (a Return event with value ``null``); any other status ends it with an Error event that
reads like the last line of Python's traceback: ``sys.exit(3)`` gives ``SystemExit: 3``,
``sys.exit("no input")`` gives ``SystemExit: no input``, and ``raise KeyboardInterrupt`` gives
``KeyboardInterrupt``. Output sent before goes out first, and every page returns to the pool.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAIN_EXITS", "exit_outcome"]

MAIN_EXITS = (SystemExit, KeyboardInterrupt)
"""What ``except`` catches besides ``Exception`` around an inferlet's ``main``."""


def exit_outcome(exc: BaseException) -> tuple[str, Any]:
    """The terminal event ``(kind, value)`` for ``exc``, one of :data:`MAIN_EXITS` that ended
    ``main`` (or the import of its module): ``("return", None)`` for a successful
    ``sys.exit``, else ``("error", text)``."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or (isinstance(code, int) and code == 0):  # what `python prog.py` exits 0 for
            return "return", None
    text = str(exc)
    return "error", f"{type(exc).__name__}: {text}" if text else type(exc).__name__
