"""``main``'s return value travels as JSON: the one check every runner makes (stdlib only, so the
wasm guest imports it too)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["encode_return", "check_return"]


def encode_return(value: Any) -> str:
    """``value`` as strict JSON.

    Raises:
        TypeError: ``value`` is not JSON (a set, bytes, an object, NaN, a dict with tuple keys,
            a cycle, ...); one line naming the type and saying what to return instead.
    """
    refused: list[Any] = []

    def refuse(obj: Any) -> Any:
        refused.append(obj)
        raise TypeError

    try:
        return json.dumps(value, allow_nan=False, default=refuse)
    except (TypeError, ValueError, RecursionError) as exc:
        top = f"a value of type {type(value).__name__}"
        if refused:
            inner = "" if refused[0] is value else f" holding a value of type {type(refused[0]).__name__}"
            what = f"{top}{inner}, which is not JSON-serialisable"
        elif isinstance(exc, RecursionError):
            what = f"{top} nested too deeply to encode"
        elif isinstance(exc, TypeError):  # json.dumps refuses a key without asking ``default``
            what = f"{top} with a dict key that is not a str, int, float, bool or None"
        elif "Circular" in str(exc):
            what = f"{top} that contains itself"
        else:  # allow_nan=False
            what = f"{top} that is or holds NaN or infinity, which JSON cannot represent"
        advice = "return JSON-compatible values (dict, list, str, int, float, bool or None)"
        raise TypeError(f"main returned {what}: {advice}") from None


def check_return(value: Any) -> Any:
    """``value`` itself, once :func:`encode_return` accepts it (same errors)."""
    encode_return(value)
    return value
