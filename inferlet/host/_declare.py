"""``@host``: turn a typed stub into the host function the SDK calls.

A declaration is a function with a signature, type hints and a docstring and no body. The
decorator records it and returns a function with the same signature that checks its arguments
against the hints (:mod:`inferlet.host.arguments`: what the wire can carry, the same in every
runner) and sends ``(interface, name)`` and every argument, in declared order, through the
installed transport (:mod:`inferlet.host.transport`). The forwarding function is compiled from
the signature and the hints, so a call whose values are fine costs one expression per checked
parameter, one tuple and one method call, and ``help()`` shows the declaration.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from inferlet.host.arguments import plan
from inferlet.host.transport import SLOT, Key

__all__ = ["host", "Declaration", "DECLARED"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Declaration:
    """One host function as declared.

    Attributes:
        key: ``(interface, name)``.
        stub: The declared function itself (its signature, hints and docstring).
        function: What the SDK calls: the stub's signature, forwarding to the transport.
        is_async: A coroutine host function (``async def``).
        oneway: The caller does not wait for it (see :func:`host`).
    """

    key: Key
    stub: Callable[..., Any]
    function: Callable[..., Any]
    is_async: bool
    oneway: bool = False

    @property
    def parameters(self) -> list[inspect.Parameter]:
        return list(inspect.signature(self.stub).parameters.values())


DECLARED: dict[Key, Declaration] = {}
"""Every declared host function, filled as the interface modules are imported."""


def host(stub: F | None = None, *, oneway: bool = False) -> Any:
    """Declare ``stub`` as host function ``(<its module's last name>, <its name>)``
    (``@host``, or ``@host(oneway=True)``).

    Args:
        oneway: The call returns None and the caller need not wait for it: a transport may send
            it without waiting (``Transport.tell``), and a failure is the host's to log, never
            the caller's to catch (an argument the declaration does not admit is still refused
            at once, before anything is sent). For emitting events and releasing from finalisers.

    The declared function raises InvalidInput, before anything crosses, for an argument its
    hint does not admit (:mod:`inferlet.host.arguments`), and passes values a rule converts (an
    int for a float) converted.

    Raises:
        TypeError: A parameter is not positional-or-keyword (every transport passes the
            arguments in declared order), the name is declared twice, a one-way call is a
            coroutine, or a hint has no WIT mapping.
    """
    if stub is None:
        return lambda fn: _declare(fn, oneway)
    return _declare(stub, oneway)


def _declare(stub: F, oneway: bool) -> F:
    key = (stub.__module__.rpartition(".")[2], stub.__name__)
    if key in DECLARED:
        raise TypeError(f"host function {key[0]}.{key[1]} is declared twice")
    params = list(inspect.signature(stub).parameters.values())
    odd = [p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if odd:
        raise TypeError(f"{key[0]}.{key[1]}: parameters {odd} must be plain positional-or-keyword ones")
    is_async = inspect.iscoroutinefunction(stub)
    if oneway and is_async:
        raise TypeError(f"{key[0]}.{key[1]}: a one-way call is a plain function")
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    signature = ", ".join(f"{n}=_defaults[{n!r}]" if n in defaults else n for n in names)
    args = "(" + "".join(f"{n}, " for n in names) + ")"
    method = "call_async" if is_async else "tell" if oneway else "call"
    send = f"{'await ' if is_async else ''}_slot.transport.{method}(_key, {args})"
    checks = plan(key, stub)
    tests = " and ".join(f"({t})" for t in checks.tests if t)
    check = f"    if not ({tests}):\n        {args[1:-1]} = _convert({args})\n" if tests else ""
    source = f"{'async ' if is_async else ''}def {key[1]}({signature}):\n{check}    return {send}\n"
    namespace: dict[str, Any] = {**checks.namespace, "_slot": SLOT, "_key": key, "_defaults": defaults,
                                 "_convert": checks.convert}
    exec(compile(source, f"<host function {key[0]}.{key[1]}>", "exec"), namespace)  # noqa: S102 - our own text
    function = functools.wraps(stub)(namespace[key[1]])
    DECLARED[key] = Declaration(key, stub, function, is_async, oneway)
    return function  # type: ignore[return-value]
