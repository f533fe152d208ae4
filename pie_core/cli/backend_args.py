"""``--dtype`` and ``--backend-option KEY=VALUE``: the backend options of ``pie run`` and ``pie serve``."""

from __future__ import annotations

import argparse
from typing import Any

from pie_core.errors import InvalidInput
from pie_core.hookspec import BackendOptions

__all__ = ["add_backend_arguments", "backend_options"]


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--dtype`` and the repeatable ``--backend-option`` to a command."""
    p.add_argument("--dtype", default="auto", help="weights and activations: auto (the backend's best), float32, bfloat16, float16")
    p.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a backend-specific option, e.g. quant=int8 or threads=2 for torch (repeatable; "
        "true/false and integers are converted)",
    )


def backend_options(args: argparse.Namespace) -> BackendOptions:
    """The options the flags ask for.

    Raises:
        InvalidInput: A ``--backend-option`` is not ``KEY=VALUE``.
    """
    extra: dict[str, Any] = {}
    for item in args.backend_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--backend-option {item!r}: expected KEY=VALUE, e.g. quant=int8")
        extra[key.strip()] = _value(value.strip())
    return BackendOptions(dtype=args.dtype, extra=extra)


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text
