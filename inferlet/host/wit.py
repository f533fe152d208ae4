"""How a declared host function's Python values map onto its WIT types: a small "spec" per
parameter and result, derived from the declaration's type hints.

Both ends of the wasm runner convert by the same spec: the guest's transport (in the component)
between the SDK's values and componentize-py's bindings, the engine's wasm host
(``pie_core.runtime.wasm``) between wasmtime's values and the engine's. A spec is a plain tuple:

=========================  ==========================================================
``("v",)``                 str, int, float, bool, a ``Literal`` of str: as is (an ``int``'s
                           width, ``u32`` unless ``S32``/``U64``/``S64`` says otherwise, is
                           what :mod:`inferlet.host.arguments` checks before a call crosses)
``("b",)``                 bytes (``list<u8>``)
``("j",)``                 a JSON-shaped value (``Any``, ``Mapping``, ``dict``): JSON text
``("l", s)``               a list of ``s`` (``list``, ``Sequence``, ``Iterable``, ``tuple[X, ...]``)
``("o", s)``               ``s | None`` (``option<s>``)
``("t", (s, ...))``        a fixed tuple
``("r", name, ((f, s), ...))``  a record: a dataclass of :data:`~inferlet.host.types.RECORDS`
``("e", name)``            an ``IntEnum`` (a WIT ``enum``)
``("p",)``                 a probe value (the ``probe-value`` variant, picked by Python type)
``("h", kind)``            a handle (:class:`~inferlet.host.types.Handle`): a WIT resource
``None``                   no value (a ``None`` result)
=========================  ==========================================================
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import types
import typing
from typing import Any, Callable

from inferlet.host import types as _types

__all__ = ["Spec", "FunctionSpec", "function_spec", "kebab", "RECORDS", "RESOURCES"]

Spec = Any  # a nested tuple as in the table above, or None

RECORDS = tuple(cls.__name__ for cls in _types.RECORDS)
"""Dataclasses that cross by value, as records of the same name."""

RESOURCES: dict[type, str] = {cls: cls.wit for cls in _types.HANDLES}
"""The WIT resource of each handle kind."""

_JSON = (Any, object, dict, collections.abc.Mapping)
_LISTS = (list, tuple, collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)


def kebab(name: str) -> str:
    """``commit_working_pages`` -> ``commit-working-pages`` (WIT names)."""
    return name.replace("_", "-").lower()


@dataclasses.dataclass(frozen=True, slots=True)
class FunctionSpec:
    """One host function's conversions: its parameters in order, its result, whether async."""

    params: tuple[tuple[str, Spec], ...]
    result: Spec
    is_async: bool


def function_spec(fn: Callable[..., Any], handles: dict[type, str] = RESOURCES) -> FunctionSpec:
    """The spec of host function ``fn`` (a declaration's stub); ``handles`` maps handle classes
    to resource names.

    Raises:
        TypeError: A hint has no WIT mapping (the contract test names it too).
    """
    names = {cls.__name__: cls for cls in handles}  # names a module imports only for type checking
    hints = typing.get_type_hints(fn, localns=names)
    params = tuple((p.name, _spec(hints.get(p.name, Any), handles, fn, p.name))
                   for p in inspect.signature(fn).parameters.values())
    return FunctionSpec(params, _spec(hints.get("return", Any), handles, fn, "return"),
                        inspect.iscoroutinefunction(fn))


def _spec(hint: Any, handles: dict[type, str], fn: Callable[..., Any], where: str) -> Spec:
    if hint is type(None) or hint is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _spec(rest[0] if len(rest) == 1 else Any, handles, fn, where)
        return ("o", inner) if len(rest) < len(args) else inner
    if origin is typing.Literal or hint in (str, int, float, bool):
        return ("v",)
    if hint is bytes:
        return ("b",)
    if isinstance(hint, type) and hint in handles:
        return ("h", handles[hint])
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return ("e", hint.__name__)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and hint.__name__ in RECORDS:
        fields = typing.get_type_hints(hint)
        return ("r", hint.__name__, tuple((f.name, _field(hint, f.name, fields[f.name], handles, fn))
                                          for f in dataclasses.fields(hint)))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return ("t", tuple(_spec(a, handles, fn, where) for a in args))
    if origin in (dict, collections.abc.Mapping) or hint in _JSON:
        return ("j",)
    if origin in _LISTS or hint in _LISTS:
        item = args[0] if args else Any
        return ("j",) if item in _JSON else ("l", _spec(item, handles, fn, where))
    raise TypeError(f"{fn.__module__}.{fn.__qualname__}: {where}: no WIT mapping for {hint!r}")


def _field(cls: type, name: str, hint: Any, handles: dict[type, str], fn: Callable[..., Any]) -> Spec:
    if (cls.__name__, name) == ("SampleSpec", "logit_mask"):
        return ("o", ("b",))  # packed vocabulary bits, or no mask
    if (cls.__name__, name) == ("RequestOutput", "probes"):
        return ("l", ("p",))  # each probe's value, whose type depends on its kind
    return _spec(hint, handles, fn, f"{cls.__name__}.{name}")
