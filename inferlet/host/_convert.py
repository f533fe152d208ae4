"""The exact half of :mod:`inferlet.host.arguments`: a value as it crosses (converted where a
rule says so) or the InvalidInput that names what is wrong with it; and the C-speed test of a
list of ints both halves use. The compiled tests of ``arguments`` decide whether a call needs
this at all."""

from __future__ import annotations

import array
import collections.abc
import dataclasses
import numbers
import operator
from typing import Any

from inferlet.host.errors import InvalidInput

__all__ = ["convert", "ints_fit"]

Kind = tuple  # inferlet.host.arguments.Kind

_NOT_LISTS = (str, bytes, bytearray, memoryview, dict, collections.abc.Mapping, collections.abc.Set)
_ONLY_INT = frozenset({int})
_U32_CODE = next((code for code in "IL" if array.array(code).itemsize == 4), None)  # C's 32-bit unsigned


def ints_fit(v: Any, low: int, high: int) -> bool:
    """A list or tuple of plain ints, each ``low <= x < high``, at C speed: a scan of the types,
    and ``array('I', v)`` (which checks the range of a ``u32`` as it converts) or ``min`` and
    ``max``. One element, a decode step's usual input, is checked as a scalar."""
    t = type(v)
    if t is not list and t is not tuple:
        return False
    n = len(v)
    if n < 2:
        return n == 0 or (type(v[0]) is int and low <= v[0] < high)
    if not _ONLY_INT.issuperset(map(type, v)):
        return False
    if low == 0 and high == 2**32 and _U32_CODE is not None:
        try:
            array.array(_U32_CODE, v)
        except OverflowError:
            return False
        return True
    return min(v) >= low and max(v) < high


def _describe(kind: Kind) -> str:
    tag = kind[0]
    if tag == "int":
        return f"an int >= {kind[1].low} and < {kind[1].high}"
    if tag == "float":
        return "a float"
    if tag == "bool":
        return "a bool"
    if tag == "str":
        return "a str"
    if tag == "bytes":
        return "bytes"
    if tag == "opt":
        return f"{_describe(kind[1])} or None"
    if tag == "list":
        return f"a list of {_plural(kind[1])}"
    if tag == "tuple":
        return f"a tuple of {len(kind[1])} values"
    if tag in ("record", "enum", "handle"):
        return f"a {kind[1].__name__}"
    return "a value"


def _plural(kind: Kind) -> str:
    if kind[0] == "int":
        return f"ints >= {kind[1].low} and < {kind[1].high}"
    words = _describe(kind)
    return words[2:] + "s" if words.startswith("a ") else words


def _refuse(what: str, where: str, kind: Kind, value: Any, shown: str | None = None,
            optional: bool = False) -> InvalidInput:
    got = shown if shown is not None else type(value).__name__
    return InvalidInput(f"{what}: {where} must be {_describe(('opt', kind) if optional else kind)}, got {got}")


def convert(kind: Kind, value: Any, where: str, what: str, optional: bool = False) -> Any:
    """``value`` as it crosses, or InvalidInput naming ``where`` (``optional``: None would do)."""
    tag = kind[0]
    if tag == "int":
        r = kind[1]
        if type(value) is not int:
            if isinstance(value, bool) or not hasattr(type(value), "__index__"):
                raise _refuse(what, where, kind, value, optional=optional)
            value = operator.index(value)
        if not r.low <= value < r.high:
            raise _refuse(what, where, kind, value, str(value), optional)
        return value
    if tag == "float":
        if type(value) is float:
            return value
        if isinstance(value, numbers.Real) and not isinstance(value, bool):  # an int, numpy's float32...
            try:
                return float(value)
            except OverflowError:
                raise _refuse(what, where, kind, value, str(value), optional) from None
        raise _refuse(what, where, kind, value, repr(value) if isinstance(value, bool) else None, optional)
    if tag == "bool":
        if value is True or value is False:
            return value
        raise _refuse(what, where, kind, value, optional=optional)
    if tag == "str":
        if isinstance(value, str):
            return str(value)
        raise _refuse(what, where, kind, value, optional=optional)
    if tag == "bytes":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise _refuse(what, where, kind, value, optional=optional)
    if tag == "opt":
        return None if value is None else convert(kind[1], value, where, what, True)
    if tag == "list":
        return _convert_list(kind, value, where, what, optional)
    if tag == "tuple":
        if not isinstance(value, (tuple, list)) or len(value) != len(kind[1]):
            raise _refuse(what, where, kind, value, optional=optional)
        return tuple(convert(k, v, f"{where}[{i}]", what) for i, (k, v) in enumerate(zip(kind[1], value)))
    if tag == "record":
        cls = kind[1]
        if not isinstance(value, cls):
            raise _refuse(what, where, kind, value, optional=optional)
        changed = {}
        for field, k in kind[2]:
            old = getattr(value, field)
            new = convert(k, old, f"{where}.{field}", what)
            if new is not old:
                changed[field] = new
        return dataclasses.replace(value, **changed) if changed else value
    if tag == "enum":
        cls = kind[1]
        if isinstance(value, cls):
            return value
        if type(value) is int and value in cls._value2member_map_:
            return cls(value)
        raise _refuse(what, where, kind, value, repr(value) if isinstance(value, int) else None, optional)
    return value  # handles and JSON-shaped values


def _convert_list(kind: Kind, value: Any, where: str, what: str, optional: bool) -> Any:
    item = kind[1]
    if type(value) is not list and type(value) is not tuple:
        if isinstance(value, _NOT_LISTS) or not isinstance(value, collections.abc.Iterable):
            raise _refuse(what, where, kind, value, optional=optional)
        value = list(value.tolist() if hasattr(value, "tolist") else value)  # a numpy array: its plain values
    if item[0] == "int":
        r = item[1]
        if ints_fit(value, r.low, r.high):
            return value
        out = list(value)
        for i, x in enumerate(out):
            if type(x) is not int:
                if isinstance(x, bool) or not hasattr(type(x), "__index__"):
                    raise InvalidInput(f"{what}: {where} must be {_plural(item)}, got {type(x).__name__} at index {i}")
                out[i] = x = operator.index(x)
            if not r.low <= x < r.high:
                raise InvalidInput(f"{what}: {where} must be {_plural(item)}, got {x} at index {i}")
        return out
    out = [convert(item, x, f"{where}[{i}]", what) for i, x in enumerate(value)]
    return value if all(a is b for a, b in zip(out, value)) and type(value) in (list, tuple) else out
