"""Messages between the engine and a worker: length-prefixed pickles.

Engine-side objects that must stay in the engine (contexts, matchers, subscriptions, MCP
sessions, chat builders) cross as :class:`Ref` ids. The engine decodes what a worker sends with
a restricted unpickler: only plain data, numpy arrays, and Pie's own frozen dataclasses, enums
and errors may appear, so a hostile worker cannot make the engine run code.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pathlib
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Ref", "HandleTable", "encode_for_worker", "decode_from_worker", "frame", "is_value", "HEADER"]

HEADER = struct.Struct("!I")
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset, range, slice)


@dataclass(frozen=True, slots=True)
class Ref:
    """An engine-side object, named by its id in the worker's handle table."""

    id: int


class HandleTable:
    """Engine-side objects a worker holds by id."""

    def __init__(self) -> None:
        self._objs: dict[int, Any] = {}
        self._ids: dict[int, int] = {}

    def ref(self, obj: Any) -> int:
        key = id(obj)
        if key not in self._ids:
            self._ids[key] = len(self._objs) + 1
            self._objs[self._ids[key]] = obj
        return self._ids[key]

    def get(self, rid: int) -> Any:
        try:
            return self._objs[rid]
        except KeyError:
            raise LookupError(f"unknown handle {rid}") from None


def is_value(obj: Any) -> bool:
    """True for what crosses by value: plain data, numpy, paths, enums, errors, dataclasses."""
    if isinstance(obj, _PLAIN + (np.ndarray, np.generic, np.dtype, enum.Enum, BaseException, Ref, pathlib.PurePath)):
        return True
    return not isinstance(obj, type) and _frozen_dataclass(type(obj))


def _frozen_dataclass(cls: type) -> bool:
    """Frozen dataclasses are Pie's value types (specs, outputs, sources); mutable ones such as
    ``HostInstance`` hold engine state and must never cross by value."""
    return dataclasses.is_dataclass(cls) and bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]


class _EnginePickler(pickle.Pickler):
    def __init__(self, buf: io.BytesIO, table: HandleTable) -> None:
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self.table = table

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, type) or is_value(obj):
            return None
        return self.table.ref(obj)


def encode_for_worker(msg: Any, table: HandleTable) -> bytes:
    """Pickle ``msg`` for the worker; non-value objects become handle ids."""
    buf = io.BytesIO()
    _EnginePickler(buf, table).dump(msg)
    return frame(buf.getvalue())


_NUMPY = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
          ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
_BUILTINS = {"set", "frozenset", "bytearray", "complex", "range", "slice"}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, table: HandleTable) -> None:
        super().__init__(buf)
        self.table = table

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("workers may not send persistent ids")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY or (module == "builtins" and name in _BUILTINS):
            return super().find_class(module, name)
        if module == "numpy" or module.startswith("numpy.dtypes"):
            cls = super().find_class(module, name)
            if isinstance(cls, type) and issubclass(cls, (np.generic, np.dtype)):
                return cls
        if module.startswith("pie_core."):
            cls = super().find_class(module, name)
            if isinstance(cls, type) and (_frozen_dataclass(cls) or issubclass(cls, (enum.Enum, BaseException))):
                return cls
        raise pickle.UnpicklingError(f"a worker may not send {module}.{name}")


def decode_from_worker(data: bytes, table: HandleTable) -> Any:
    """Unpickle a worker's message (restricted) and swap :class:`Ref` for the objects they name."""
    return _resolve(_RestrictedUnpickler(io.BytesIO(data), table).load(), table)


def _resolve(obj: Any, table: HandleTable) -> Any:
    if isinstance(obj, Ref):
        return table.get(obj.id)
    if isinstance(obj, list):
        return [_resolve(x, table) for x in obj]
    if isinstance(obj, tuple):
        return tuple(_resolve(x, table) for x in obj)
    if isinstance(obj, dict):
        return {k: _resolve(v, table) for k, v in obj.items()}
    return obj


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload
