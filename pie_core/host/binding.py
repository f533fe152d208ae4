"""Which inferlet instance a host call serves: bound per asyncio task through a ContextVar."""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pie_core.errors import PieError

if TYPE_CHECKING:
    from pie_core.runtime.engine import Engine
    from pie_core.runtime.events import Event

__all__ = ["HostInstance", "current", "bind", "unbind"]


@dataclass(eq=False)
class HostInstance:
    """Per-instance state the host API needs: who runs, where events go, what it holds."""

    engine: Engine
    emit: Callable[[Event], None]
    username: str = "local"
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    resources: set[Any] = field(default_factory=set)  # objects with .release(), freed at exit
    inbox: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    files: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    scratch_root: Path | None = None  # per-user scratch dirs live under it (server only)

    def release_all(self) -> None:
        """Free every resource the instance still holds (its pages return to the pools)."""
        for res in list(self.resources):
            res.release()
        self.resources.clear()


_current: contextvars.ContextVar[HostInstance | None] = contextvars.ContextVar("pie_instance", default=None)


def current() -> HostInstance:
    """The instance the calling task belongs to.

    Raises:
        PieError: Called outside a running inferlet.
    """
    inst = _current.get()
    if inst is None:
        raise PieError("no inferlet instance is bound to this task; run it through the engine (pie run)")
    return inst


def bind(instance: HostInstance) -> contextvars.Token[HostInstance | None]:
    return _current.set(instance)


def unbind(token: contextvars.Token[HostInstance | None]) -> None:
    _current.reset(token)
