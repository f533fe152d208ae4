"""What a host call's arguments may be, checked in the SDK before anything crosses.

Each declared parameter admits what its hint says, in the terms of what the wire carries
(the WIT type :mod:`inferlet.host.wit` maps it to). Every declared function checks its own
arguments (:func:`inferlet.host._declare.host` compiles the check into it), whatever the
transport, so every runner refuses a value the same way, with the same message, before it
crosses; the engine runs the same :func:`check` on what a sandboxed inferlet sends. What a
value means (a token id below the vocabulary size, a bid that is finite) is the engine's to
check.

================================  ================================================================
hint                              admits
================================  ================================================================
``int`` (a ``U32``)               an int ``>= 0 and < 2**32``; ``S32``, ``U64`` and ``S64``
                                  (:mod:`~inferlet.host.types`) name the other ranges. A bool is
                                  not an int; an ``int`` subclass or an ``__index__`` type
                                  (numpy's) becomes an int.
``float``                         a float; an int (not a bool) or another real number becomes a
                                  float, so every runner sees ``0.0`` for ``0``
``bool``                          ``True`` or ``False``
``str``, a ``Literal`` of str     a str
``bytes``                         bytes; a bytearray or memoryview becomes bytes
``Sequence[X]``, ``list[X]``...   a list or tuple of X; another iterable (not a str, bytes or
                                  mapping) becomes a list
``X | None``                      None or X
a record (``SampleSpec``...)      an instance, each field as its hint says
an ``IntEnum``                    a member; an int that is one becomes it
a handle (``Context``...)         the transport's object of that kind: checked where the kinds
                                  are known (:func:`check`'s ``handles``)
JSON-shaped (``Any``, mappings)   anything: the transport encodes it
================================  ================================================================

Cost: a call whose values are all fine runs one compiled expression per parameter (``type(n)
is int and 0 <= n < 4294967296``); a list of ints is two C-speed passes, one over the types and
one converting it to a ``u32`` array (which checks the range), and a record one attribute read
and test per field. A handle-only call (``inference.forward_next(ctx)``) checks nothing.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from inferlet.host import types as _types
from inferlet.host import _convert
from inferlet.host import errors as _errors
from inferlet.host.types import IntRange

__all__ = ["Kind", "kind_of", "Plan", "plan", "check", "check_handles"]

Kind = tuple
"""What one value may be, as the table above: ``("int", IntRange)``, ``("float",)``,
``("bool",)``, ``("str",)``, ``("bytes",)``, ``("list", Kind)``, ``("opt", Kind)``,
``("tuple", (Kind, ...))``, ``("record", cls, ((field, Kind), ...))``, ``("enum", cls)``,
``("handle", cls)`` or ``("any",)``."""

_U32 = typing.get_args(_types.U32)[1]
_JSON = (Any, object, dict, collections.abc.Mapping)
_LISTS = (list, tuple, collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
_HANDLE_NAMES = {cls.__name__: cls for cls in _types.HANDLES}
_LOOSE_FIELDS: dict[tuple[str, str], Kind] = {
    ("SampleSpec", "logit_mask"): ("opt", ("bytes",)),  # packed vocabulary bits (a numpy row in the engine)
    ("RequestOutput", "probes"): ("any",),  # each probe's value, whose type depends on its kind
}


def kind_of(hint: Any, where: str = "") -> Kind:
    """The :data:`Kind` of a resolved hint (extras included).

    Raises:
        TypeError: The hint has no WIT mapping (as :func:`inferlet.host.wit.function_spec`).
    """
    if hint is type(None) or hint is None:
        return ("any",)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        ranges = [a for a in hint.__metadata__ if isinstance(a, IntRange)]
        return ("int", ranges[0]) if ranges and args[0] is int else kind_of(args[0], where)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = kind_of(rest[0], where) if len(rest) == 1 else ("any",)  # a union of several: JSON
        return ("opt", inner) if len(rest) < len(args) and inner != ("any",) else inner
    if origin is typing.Literal or hint is str:
        return ("str",)
    if hint is bool:
        return ("bool",)
    if hint is int:
        return ("int", _U32)
    if hint is float:
        return ("float",)
    if hint is bytes:
        return ("bytes",)
    if isinstance(hint, type) and issubclass(hint, _types.Handle):
        return ("handle", hint)
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return ("enum", hint)
    if isinstance(hint, type) and hint in _types.RECORDS:
        fields = typing.get_type_hints(hint, include_extras=True)
        return ("record", hint, tuple(
            (f.name, _LOOSE_FIELDS.get((hint.__name__, f.name)) or kind_of(fields[f.name], f"{hint.__name__}.{f.name}"))
            for f in dataclasses.fields(hint)))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return ("tuple", tuple(kind_of(a, where) for a in args))
    if origin in (dict, collections.abc.Mapping) or hint in _JSON:
        return ("any",)
    if origin in _LISTS or hint in _LISTS:
        item = args[0] if args else Any
        return ("any",) if item in _JSON else ("list", kind_of(item, where))
    raise TypeError(f"{where}: no WIT mapping for {hint!r}")


@dataclass(frozen=True, slots=True)
class Plan:
    """How one declared function's arguments are checked.

    Attributes:
        what: ``interface.name()``, the start of every message.
        names: The parameters, in order.
        kinds: Each parameter's :data:`Kind`.
        tests: Per parameter, a Python expression over the parameter's name that is true when
            its value crosses as it is (``""``: anything does); :func:`host` compiles them into
            the declared function.
        namespace: The names the expressions use.
        fast: The expressions as one function of the arguments (None: nothing to check).
        handles: ``(index, declared class, may be None)`` of each handle parameter.
    """

    what: str
    names: tuple[str, ...]
    kinds: tuple[Kind, ...]
    tests: tuple[str, ...]
    namespace: dict[str, Any]
    fast: Callable[..., bool] | None
    handles: tuple[tuple[int, type, bool], ...]

    def convert(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` as they cross: the values a rule converts replaced (an int for a float...).

        Raises:
            InvalidInput: A value the declaration does not admit; the message names it.
        """
        return tuple(_convert.convert(kind, value, name, self.what)
                     for kind, value, name in zip(self.kinds, args, self.names))


_PLANS: dict[tuple[str, str], Plan] = {}


def plan(key: tuple[str, str], stub: Callable[..., Any]) -> Plan:
    """The :class:`Plan` of host function ``key`` declared by ``stub`` (made once)."""
    found = _PLANS.get(key)
    if found is None:
        found = _PLANS[key] = _make_plan(key, stub)
    return found


def check(decl: Any, args: tuple[Any, ...], handles: Mapping[type, type] | None = None) -> tuple[Any, ...]:
    """The arguments of a call of declared function ``decl`` (a
    :class:`~inferlet.host.Declaration`, or its :class:`Plan`) as they cross: ``args`` itself
    when every value is what the declaration admits as it is, else a copy with the converted
    values.

    Args:
        decl: The declaration, or its plan.
        args: Every declared parameter's value, in order.
        handles: The transport's class for each declared handle class (``{Context:
            HostContext, ...}``): each handle argument must be one, and no other argument may
            be one. None: handles are not checked (the transport does it).

    Raises:
        InvalidInput: A value outside what the declaration admits; the message names the
            parameter (and the index or field) and what it must be.
        TypeError: A handle argument is not of its declared kind, or a handle was passed for a
            parameter that takes none.
    """
    p = decl if isinstance(decl, Plan) else plan(decl.key, decl.stub)
    if handles is not None and p.handles:
        check_handles(p, args, handles)
    if p.fast is None or p.fast(*args):
        return args
    try:
        return p.convert(args)
    except _errors.InvalidInput:
        if handles is not None:
            _no_stray_handle(p, args, handles)
        raise


def check_handles(p: Plan, args: tuple[Any, ...], handles: Mapping[type, type]) -> None:
    """Raise TypeError unless each handle argument of ``p`` is the transport's object of its
    declared kind (``handles`` as in :func:`check`), or None where the parameter is optional."""
    for i, declared, optional in p.handles:
        value = args[i]
        if type(value) is handles[declared] or (value is None and optional) or isinstance(value, handles[declared]):
            continue
        other = _kind_of_handle(value, handles)
        if other is not None:
            raise TypeError(f"{p.what}: {p.names[i]} cannot be a {other.__name__} handle")
        raise TypeError(f"{p.what}: {p.names[i]} must be a {declared.__name__} handle"
                        f"{' or None' if optional else ''}, got {type(value).__name__}")


def _no_stray_handle(p: Plan, args: tuple[Any, ...], handles: Mapping[type, type]) -> None:
    """Raise TypeError if a handle was passed for a parameter that takes none."""
    taken = {i for i, _, _ in p.handles}
    for i, value in enumerate(args):
        other = None if i in taken else _kind_of_handle(value, handles)
        if other is not None:
            raise TypeError(f"{p.what}: {p.names[i]} cannot be a {other.__name__} handle")


def _kind_of_handle(value: Any, handles: Mapping[type, type]) -> type | None:
    return next((declared for declared, cls in handles.items() if isinstance(value, cls)), None)


# -- the plan: a compiled test per parameter ------------------------------------------------------


def _make_plan(key: tuple[str, str], stub: Callable[..., Any]) -> Plan:
    what = f"{key[0]}.{key[1]}()"
    hints = typing.get_type_hints(stub, localns=_HANDLE_NAMES, include_extras=True)
    names = tuple(inspect.signature(stub).parameters)
    kinds = tuple(kind_of(hints.get(n, Any), f"{what}: {n}") for n in names)
    handles = []
    for i, kind in enumerate(kinds):
        optional = kind[0] == "opt"
        inner = kind[1] if optional else kind
        if inner[0] == "handle":
            handles.append((i, inner[1], optional))
        elif _holds_handle(kind):
            raise TypeError(f"{what}: {names[i]}: a handle crosses as a parameter of its own or an optional one")
    compiler = _Compiler()
    tests = tuple(compiler.test(kind, name) for kind, name in zip(kinds, names))
    fast = None
    if any(tests):
        body = " and ".join(f"({t})" for t in tests if t)
        source = f"def fast({', '.join(names)}):\n    return {body}\n"
        exec(compile(source, f"<argument checks of {what}>", "exec"), compiler.namespace)  # noqa: S102 - our own text
        fast = compiler.namespace.pop("fast")
    return Plan(what, names, kinds, tests, compiler.namespace, fast, tuple(handles))


def _holds_handle(kind: Kind) -> bool:
    tag = kind[0]
    if tag == "handle":
        return True
    if tag in ("list", "opt"):
        return _holds_handle(kind[1])
    if tag == "tuple":
        return any(_holds_handle(k) for k in kind[1])
    if tag == "record":
        return any(_holds_handle(k) for _, k in kind[2])
    return False


class _Compiler:
    """Makes the fast test of each kind: a Python expression, with helpers in ``namespace``."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"_ints": _convert.ints_fit}
        self._n = 0

    def _name(self, value: Any) -> str:
        self._n += 1
        name = f"_h{self._n}"
        self.namespace[name] = value
        return name

    def test(self, kind: Kind, v: str) -> str:
        """An expression over ``v`` that is true when the value crosses as it is; ``""``: always."""
        tag = kind[0]
        if tag == "int":
            r = kind[1]
            return f"type({v}) is int and {r.low} <= {v} < {r.high}"
        if tag in ("float", "str", "bytes"):
            return f"type({v}) is {tag}"
        if tag == "bool":
            return f"({v} is True or {v} is False)"
        if tag == "enum":
            return f"type({v}) is {self._name(kind[1])}"
        if tag == "opt":
            inner = self.test(kind[1], v)
            return f"({v} is None or {inner})" if inner else ""
        if tag == "list":
            item = kind[1]
            if item[0] == "int":
                return f"_ints({v}, {item[1].low}, {item[1].high})"
            inner = self.test(item, "x")
            if not inner:
                return f"(type({v}) is list or type({v}) is tuple)"
            each = self._function(f"def each(x):\n    return {inner}\n")
            return f"(type({v}) is list or type({v}) is tuple) and (not {v} or all(map({each}, {v})))"
        if tag == "tuple":
            parts = [self.test(k, f"{v}[{i}]") for i, k in enumerate(kind[1])]
            return " and ".join([f"type({v}) is tuple and len({v}) == {len(parts)}", *(f"({p})" for p in parts if p)])
        if tag == "record":
            lines = [f"def each(x):\n    if type(x) is not {self._name(kind[1])}:\n        return False\n"]
            for field, k in kind[2]:
                inner = self.test(k, "f")
                if inner:
                    lines.append(f"    f = x.{field}\n    if not ({inner}):\n        return False\n")
            lines.append("    return True\n")
            return f"{self._function(''.join(lines))}({v})"
        return ""  # handles (checked by kind where the kinds are known) and JSON-shaped values

    def _function(self, source: str) -> str:
        name = self._name(None)
        exec(compile(source.replace("def each(", f"def {name}(", 1), "<argument checks>", "exec"),  # noqa: S102
             self.namespace)
        return name
