"""The one seam between the SDK and the engine: a host transport.

Every host function the SDK calls (the declarations in :mod:`inferlet.host`) sends its call
through the transport installed in this process, and nothing else of the SDK reaches the engine.
A runner installs one before the inferlet's code runs:

- in-process (``pie run``): the engine's own functions, called directly
  (``pie_core.runtime.inprocess``);
- the process runner: frames over the worker's pipe (``pie_core.runtime.process.worker``);
- the wasm runner: the component's WIT imports (``pie_core/runtime/wasm/guest``).

Tests install a transport of their own (a mock that records calls, say) to check the SDK alone.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Protocol, runtime_checkable

from inferlet.host.errors import PieError

__all__ = ["Transport", "Key", "install", "installed", "uninstall"]

Key = tuple[str, str]
"""A host function: ``(interface, name)``, e.g. ``("context", "fork")``."""


@runtime_checkable
class Transport(Protocol):
    """How the SDK reaches the engine.

    Attributes:
        blocking: ``None`` where the inferlet shares its thread with the engine (in-process),
            so nothing may block; otherwise a factory of event loops on which the SDK's
            synchronous forms (``for event in ctx.generate(...)``, ``ctx.generate_text()`` from a
            plain ``def main``) run their waits while the inferlet's own loop waits
            (see :mod:`inferlet._blocking`).

    Ownership: a call's arguments and its value belong to the caller once the call returns (a
    transport copies what it keeps). A handle (:class:`~inferlet.host.types.Handle`) is whatever
    object the transport returned for an engine object: the SDK passes it back unchanged and
    never looks inside.
    """

    blocking: Callable[[], asyncio.AbstractEventLoop] | None

    def call(self, key: Key, args: tuple[Any, ...]) -> Any:
        """Run synchronous host function ``key`` with ``args`` (every declared parameter, in
        order) and return its value.

        Raises:
            Exception: What the host function raised (its class, with its message).
        """
        ...

    def call_async(self, key: Key, args: tuple[Any, ...]) -> Awaitable[Any]:
        """Start coroutine host function ``key`` with ``args``; the awaitable gives its value
        (or raises its error). Cancelling the awaiting task cancels the call in the engine."""
        ...

    def tell(self, key: Key, args: tuple[Any, ...]) -> None:
        """Send one-way host function ``key`` (declared ``oneway``) with ``args``, without
        waiting for it if the transport can; the engine logs a failure, nothing is raised here.
        Calls told stay in order with every other call of the inferlet."""
        ...


class _Missing:
    """The transport until a runner installs one: every call says how to run an inferlet."""

    blocking = None

    def call(self, key: Key, args: tuple[Any, ...]) -> Any:
        raise PieError(f"{key[0]}.{key[1]}: no inferlet runs in this process; the SDK works inside an inferlet "
                       "(pie run FOLDER, or pie serve)")

    def call_async(self, key: Key, args: tuple[Any, ...]) -> Awaitable[Any]:
        return self.call(key, args)

    def tell(self, key: Key, args: tuple[Any, ...]) -> None:
        self.call(key, args)


class _Slot:
    """Where the declared functions find the transport (an attribute read per call)."""

    __slots__ = ("transport",)

    def __init__(self) -> None:
        self.transport: Transport = _Missing()


SLOT = _Slot()


def install(transport: Transport) -> Transport:
    """Make ``transport`` the one every host call of this process goes through.

    Returns:
        The transport it replaces (to put back when a test is done; None: none was installed).

    Raises:
        TypeError: ``transport`` lacks ``call``, ``call_async``, ``tell`` or ``blocking``.
    """
    if not isinstance(transport, Transport):
        raise TypeError(f"a host transport needs call, call_async, tell and blocking; {type(transport).__name__} lacks some")
    previous, SLOT.transport = installed(), transport
    return previous


def uninstall() -> None:
    """Install nothing: every host call fails until a runner installs a transport again."""
    SLOT.transport = _Missing()


def installed() -> Transport | None:
    """The transport host calls go through now; None before a runner installed one."""
    current = SLOT.transport
    return None if isinstance(current, _Missing) else current
