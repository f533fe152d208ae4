"""Frames between the engine and a worker: a 4-byte length, then one msgpack value.

Plain data (None, bool, int, float, str, bytes, list, dict) is msgpack's own. The rest is an
explicit schema, the same in both directions:

* numpy arrays and scalars: ext type 1/2, ``<dtype code u8><ndim u8><shape u64 * ndim><bytes>``,
  dtype from :data:`DTYPES`, the byte count checked against the shape;
* handles (engine objects a worker holds): ext type 5, ``<id u64><kind name>``
  (see :mod:`.host_api`);
* tuples and Pie's value types: a list whose first item is a tag (ext type 3 for a tuple, ext
  type 4 naming a class of :data:`.host_api.VALUE_TYPES`), followed by the items, the
  dataclass's keyword fields, the enum's value or the error's arguments.

Decoding never runs code a frame names: classes come from one table and are built with checked
keyword fields. It is linear in the frame bytes: frames are at most :data:`MAX_FRAME` bytes,
containers nest at most :data:`MAX_DEPTH` deep and hold at most :data:`MAX_ITEMS` items, and
there are at most :data:`MAX_CONTAINERS` of them. That last bound is what a value sharing one
list many times over (``x = [x, x]`` twenty times: tiny to build, 2**20 lists once encoded) runs
into; each container costs a Python call to check, so it is counted as decoded and kept small
enough that the decode of any frame ends within a fraction of a second, and the engine decodes
large frames off its event loop. A frame that breaks any rule raises :class:`ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import time
from typing import Any, Callable

import msgpack
import numpy as np

from pie_core.runtime.host_api import VALUE_TYPES

__all__ = ["Codec", "ProtocolError", "HEADER", "MAX_FRAME", "MAX_DEPTH", "MAX_ITEMS", "MAX_CONTAINERS", "DTYPES",
           "check_frame_size"]

HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 2**20
MAX_DEPTH = 64
MAX_ITEMS = 2**22
MAX_CONTAINERS = 2**15  # each costs ~2 us to check: a decode stays under ~70 ms; 10,000 sample records fit
YIELD_EVERY = 512  # containers checked between GIL releases: the event loop waits ~1 ms for it, not a switch interval
DTYPES = tuple(np.dtype(d) for d in ("|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"))

_ARRAY, _SCALAR, _TUPLE, _VALUE, _REF = 1, 2, 3, 4, 5
_DTYPE_CODES = {d.str: i for i, d in enumerate(DTYPES)}
_ARRAY_HEAD = struct.Struct("<BB")
_REF_ID = struct.Struct("<Q")


class ProtocolError(Exception):
    """A frame broke the wire schema or one of its limits."""


class _Tag:
    """Decoded form of a tag ext: opens a list that stands for a tuple or a value type."""

    __slots__ = ("cls",)

    def __init__(self, cls: type | None) -> None:
        self.cls = cls


_TUPLE_TAG = _Tag(None)
_VALUE_TAGS = {cls.__name__: _Tag(cls) for cls in VALUE_TYPES}
assert len(_VALUE_TAGS) == len(VALUE_TYPES), "value type names must be unique"
_NAMES = {cls: name for name, cls in ((c.__name__, c) for c in VALUE_TYPES)}
_TAG_DEPTHS = {id(tag): -1 for tag in (_TUPLE_TAG, *_VALUE_TAGS.values())}
_TUPLE_EXT = msgpack.ExtType(_TUPLE, b"")


def check_frame_size(size: int) -> None:
    """Raise ProtocolError when a frame header announces more than :data:`MAX_FRAME` bytes."""
    if size > MAX_FRAME:
        raise ProtocolError(f"frames are at most {MAX_FRAME} bytes, got a header announcing {size}")


class Codec:
    """Encodes and decodes frames for one end of the pipe.

    Args:
        to_ref: For an object that is no value: its ``(id, kind name)`` as a handle, or None
            when it may not cross at all.
        from_ref: Builds the local object for a handle ``(id, kind name)``; raises
            ProtocolError for an unknown id.
    """

    def __init__(self, to_ref: Callable[[Any], tuple[int, str] | None], from_ref: Callable[[int, str], Any]) -> None:
        self._to_ref, self._from_ref = to_ref, from_ref

    def encode(self, msg: Any) -> bytes:
        """``msg`` as a frame (header included).

        Raises:
            TypeError: ``msg`` holds something that cannot cross (the message names it).
            ValueError: It nests deeper than msgpack allows, or the frame passes MAX_FRAME.
        """
        try:
            payload = msgpack.packb(msg, default=self._default, use_bin_type=True, strict_types=True)
        except OverflowError as exc:
            raise ValueError(f"an integer does not fit in 64 bits: {exc}") from None
        except ValueError as exc:
            if "recursion" not in str(exc):
                raise
            raise ValueError("a message between an inferlet worker and the engine nests deeper than 511 levels or "
                             "refers to itself; send a tree of plain data") from None
        if len(payload) > MAX_FRAME:
            raise ValueError(f"a message between an inferlet worker and the engine may take at most {MAX_FRAME} bytes, "
                             f"this one takes {len(payload)}; send large data in pieces")
        return HEADER.pack(len(payload)) + payload

    def decode(self, payload: bytes) -> Any:
        """The value in a frame's payload (header stripped).

        Raises:
            ProtocolError: The payload breaks the schema or a limit.
        """
        check_frame_size(len(payload))
        n = len(payload)
        state = _Decoding(self._from_ref)
        try:
            obj = msgpack.unpackb(
                payload, use_list=True, raw=False, strict_map_key=False, ext_hook=state.ext, list_hook=state.list,
                object_hook=state.dict, max_str_len=n, max_bin_len=n, max_ext_len=n,
                max_array_len=min(n, MAX_ITEMS), max_map_len=min(n // 2, MAX_ITEMS),
            )
        except ProtocolError:
            raise
        except Exception as exc:  # msgpack's own errors, and anything a value type's constructor raised
            raise ProtocolError(f"malformed frame: {type(exc).__name__}: {exc}") from None
        if isinstance(obj, _Tag):
            raise ProtocolError("a type tag may only open a list")
        return obj

    def _default(self, obj: Any) -> Any:
        cls = type(obj)
        if cls is tuple:
            return [_TUPLE_EXT, *obj]
        if isinstance(obj, np.ndarray):
            return msgpack.ExtType(_ARRAY, _pack_array(obj))
        if isinstance(obj, np.generic):
            return msgpack.ExtType(_SCALAR, _pack_array(np.asarray(obj)))
        if isinstance(obj, enum.Enum):
            return [self._tag(cls), obj.value]
        if isinstance(obj, BaseException):
            return self._error(obj)
        if cls in _NAMES and dataclasses.is_dataclass(obj):
            return [self._tag(cls), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}]
        ref = self._to_ref(obj)
        if ref is not None:
            return msgpack.ExtType(_REF, _REF_ID.pack(ref[0]) + ref[1].encode())
        for base in (bool, int, float, str, bytes, list, dict):  # subclasses cross as their base type
            if isinstance(obj, base):
                return base(obj)
        if isinstance(obj, tuple):
            return [_TUPLE_EXT, *obj]
        if isinstance(obj, (bytearray, memoryview)):
            return bytes(obj)
        raise TypeError(f"a {cls.__module__}.{cls.__qualname__} cannot cross between an inferlet worker and the engine; "
                        "pass plain data (str, int, float, bytes, list, tuple, dict), numpy arrays or Pie's value types")

    @staticmethod
    def _tag(cls: type) -> msgpack.ExtType:
        name = _NAMES.get(cls)
        if name is None:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} is not one of Pie's value types and cannot cross "
                            "between an inferlet worker and the engine")
        return msgpack.ExtType(_VALUE, name.encode())

    def _error(self, exc: BaseException) -> list[Any]:
        base = next(c for c in type(exc).__mro__ if c in _NAMES or c is BaseException)
        if base is BaseException:
            base = Exception
        plain = all(isinstance(a, (str, int, float, bool, type(None))) for a in exc.args)
        args = list(exc.args) if base is type(exc) and plain and len(exc.args) <= 8 else [_describe(exc, base)]
        return [self._tag(base), args]


def _describe(exc: BaseException, base: type) -> str:
    return str(exc) if base is type(exc) else f"{type(exc).__name__}: {exc}"


def _pack_array(arr: np.ndarray) -> bytes:
    le = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    code = _DTYPE_CODES.get(le.str)
    if code is None:
        raise TypeError(f"numpy arrays of dtype {arr.dtype} cannot cross between an inferlet worker and the engine; "
                        f"use one of {', '.join(str(d) for d in DTYPES)}")
    if arr.ndim > 32:
        raise ValueError(f"numpy arrays that cross have at most 32 dimensions, got {arr.ndim}")
    data = np.asarray(arr, dtype=le, order="C")
    return _ARRAY_HEAD.pack(code, data.ndim) + struct.pack(f"<{data.ndim}Q", *data.shape) + data.tobytes()


def _unpack_array(data: bytes) -> np.ndarray:
    if len(data) < _ARRAY_HEAD.size:
        raise ProtocolError("a numpy array ext is shorter than its header")
    code, ndim = _ARRAY_HEAD.unpack_from(data)
    if code >= len(DTYPES) or ndim > 32:
        raise ProtocolError(f"a numpy array ext names dtype code {code} (known: 0-{len(DTYPES) - 1}) and {ndim} "
                            "dimensions (at most 32)")
    start = _ARRAY_HEAD.size + 8 * ndim
    if len(data) < start:
        raise ProtocolError("a numpy array ext is shorter than its shape")
    shape = struct.unpack_from(f"<{ndim}Q", data, _ARRAY_HEAD.size)
    dtype = DTYPES[code]
    count = 1
    for dim in shape:
        count *= dim
    if count * dtype.itemsize != len(data) - start:
        raise ProtocolError(f"a numpy array of shape {shape} and dtype {dtype} needs {count * dtype.itemsize} bytes, "
                            f"the frame holds {len(data) - start}")
    if count == 0:
        return np.zeros(shape, dtype)
    return np.frombuffer(bytearray(memoryview(data)[start:]), dtype).reshape(shape)


class _Decoding:
    """The state of one decode: every container's nesting depth, kept alive so ids stay unique."""

    def __init__(self, from_ref: Callable[[int, str], Any]) -> None:
        self.from_ref = from_ref
        self.depth: dict[int, int] = dict(_TAG_DEPTHS)  # tags count as -1: only a list's head may be one
        self.keep: list[Any] = []

    def ext(self, code: int, data: bytes) -> Any:
        if code == _ARRAY:
            return _unpack_array(data)
        if code == _SCALAR:
            return _unpack_array(data)[()]
        if code == _TUPLE and not data:
            return _TUPLE_TAG
        if code == _VALUE:
            tag = _VALUE_TAGS.get(data.decode("utf-8", "replace"))
            if tag is None:
                raise ProtocolError(f"unknown value type {data[:64]!r}; the value types are "
                                    f"{', '.join(sorted(_VALUE_TAGS))}")
            return tag
        if code == _REF and _REF_ID.size <= len(data) <= _REF_ID.size + 64:
            return self.from_ref(_REF_ID.unpack_from(data)[0], data[_REF_ID.size:].decode("utf-8", "replace"))
        raise ProtocolError(f"unknown ext type {code} ({len(data)} bytes); known: 1-5")

    def _nest(self, children: Any, head: Any = None) -> int:
        marks = [*filter(None, map(self.depth.get, map(id, children)))]  # C loops: linear, no per-item Python
        if not marks:
            return 1
        tags = marks.count(-1)
        if tags and (tags > 1 or head is None or id(head) not in _TAG_DEPTHS):
            raise ProtocolError("a type tag may only open a list")
        level = 1 + max(marks)
        if level > MAX_DEPTH:
            raise ProtocolError(f"containers nest at most {MAX_DEPTH} deep")
        return max(level, 1)

    def _keep(self, obj: Any, level: int) -> Any:
        if len(self.keep) >= MAX_CONTAINERS:
            raise ProtocolError(f"a frame holds at most {MAX_CONTAINERS} containers")
        self.keep.append(obj)
        self.depth[id(obj)] = level
        if not len(self.keep) % YIELD_EVERY:
            time.sleep(0)  # hand the GIL over: a thread decoding off the loop must not keep the loop waiting
        return obj

    def list(self, items: list[Any]) -> Any:
        level = self._nest(items, items[0] if items else None)
        head = items[0] if items else None
        if isinstance(head, _Tag):
            return self._keep(_build(head, items[1:]), level)
        return self._keep(items, level)

    def dict(self, items: dict[Any, Any]) -> Any:
        keys = list(items)
        level = max(self._nest(keys), self._nest(items.values()))
        return self._keep(items, level)


def _build(tag: _Tag, rest: list[Any]) -> Any:
    cls = tag.cls
    if cls is None:
        return tuple(rest)
    if issubclass(cls, enum.Enum):
        if len(rest) != 1:
            raise ProtocolError(f"an enum {cls.__name__} carries exactly one value, got {len(rest)}")
        return cls(rest[0])
    if issubclass(cls, BaseException):
        if len(rest) != 1 or not isinstance(rest[0], list) or len(rest[0]) > 8:
            raise ProtocolError(f"an error {cls.__name__} carries one list of at most 8 arguments")
        return cls(*rest[0])
    if len(rest) != 1 or not isinstance(rest[0], dict):
        raise ProtocolError(f"a {cls.__name__} carries exactly one dict of fields")
    fields = rest[0]
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ProtocolError(f"{cls.__name__} has no field {str(unknown[0])[:64]!r}; its fields are {', '.join(sorted(names))}")
    return cls(**fields)
