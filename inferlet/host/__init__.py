"""The host API: everything an inferlet may ask of the engine, declared once.

Each interface is a module here (``context``, ``inference``, ``grammar``, ...) whose functions
are declarations: a signature, type hints and a docstring saying what the call receives,
returns and raises. Calling one sends it through the installed :mod:`~inferlet.host.transport`;
the engine implements each under the same name in ``pie_core.host.<interface>``, and ``wit/``
spells the same functions in WIT for the wasm sandbox. Tests check all three against
:func:`declarations`.

Values crossing by value are in :mod:`~inferlet.host.types`, the errors in
:mod:`~inferlet.host.errors`; what each parameter admits (checked by the declared function before
the call crosses, the same in every runner) in :mod:`~inferlet.host.arguments`; what every
runner does with an inferlet's ``main`` is :mod:`~inferlet.host.entry`.
"""

from __future__ import annotations

import importlib

from inferlet.host._declare import DECLARED, Declaration
from inferlet.host.transport import Key

__all__ = ["INTERFACES", "Declaration", "declarations"]

INTERFACES = ("adapter", "context", "grammar", "inference", "mcp", "messaging", "model", "runtime", "scheduling",
              "session", "speculation", "tools", "zo")
"""The host interfaces, one module each (and one WIT interface each)."""


def declarations() -> dict[Key, Declaration]:
    """Every declared host function, by ``(interface, name)``."""
    for name in INTERFACES:
        importlib.import_module(f"inferlet.host.{name}")
    return dict(DECLARED)
