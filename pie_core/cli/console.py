"""The console every ``pie`` command prints its tables to.

On a terminal rich fits tables to its width. Anywhere else (a pipe, a file, CI logs) rich would
assume 80 columns and cut or fold cells; there a table gets the width it needs, unless
``COLUMNS`` says otherwise.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

__all__ = ["stdout_console", "UNBOUNDED_WIDTH"]

UNBOUNDED_WIDTH = 10_000
"""The width a console has off a terminal: wider than any table, so no cell is cut."""


def stdout_console() -> Console:
    """A console on stdout: the terminal's width on a terminal, else unbounded (or ``$COLUMNS``)."""
    on_terminal = sys.stdout is not None and sys.stdout.isatty()
    if on_terminal or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=UNBOUNDED_WIDTH)
