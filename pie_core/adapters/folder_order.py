"""Saves and loads of one adapter folder apply in the order an inferlet issued them.

``Adapter.save`` only queues its work (it runs on the backend thread before the caller's next
pass), so ``a.save(p); b.load(p)`` would read the folder before the save wrote it. The host
therefore asks :class:`FolderOrder` whether an operation on the folder is still pending: if none
is, a load reads the folder at once; if one is, the load becomes a backend operation too, chained
after it. Each chained operation waits for the one issued before it on the same folder (at once
when both belong to one model, whose operations run in order anyway; a wait on the other
model's backend thread otherwise, which cannot cycle: every wait is for an operation issued
earlier).

A folder is keyed by what names it, per user (the components beneath the user's scratch folder),
so the chain needs no filesystem access: paths cannot pass through links (:mod:`pie_core.safepath`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Hashable

__all__ = ["FolderOrder", "Shape", "Link"]


@dataclass(frozen=True, slots=True)
class Shape:
    """What a folder holds once its pending saves ran: the LoRA shape the last one writes."""

    rank: int
    alpha: float
    rslora: bool
    targets: frozenset[str]


@dataclass(slots=True)
class Link:
    """One operation in a folder's chain: ``ran`` is set when it ran (or will never run)."""

    ran: threading.Event
    shape: Shape | None


class FolderOrder:
    """The chain of pending operations per folder key (event loop side; links are set from any thread)."""

    def __init__(self) -> None:
        self._last: dict[Hashable, Link] = {}

    def pending(self, key: Hashable) -> Shape | None:
        """The shape the folder will hold when an operation on it is still pending, else None
        (nothing pending: read it now)."""
        link = self._last.get(key)
        if link is None or link.ran.is_set():
            return None
        return link.shape

    def join(self, key: Hashable, shape: Shape | None = None) -> tuple[threading.Event | None, threading.Event]:
        """Add an operation to ``key``'s chain: what it waits for (None: nothing pending) and
        the event it sets when it ran. ``shape``: what it writes (a save); None keeps the shape
        of the operations before it (a load)."""
        before = self._last.get(key)
        if before is not None and before.ran.is_set():
            before = None
        ran = threading.Event()
        self._last[key] = Link(ran, shape if shape is not None or before is None else before.shape)
        return (None if before is None else before.ran), ran

    def settle(self, key: Hashable, ran: threading.Event, future: Any) -> None:
        """Set ``ran`` when ``future`` (its backend operation) is done, run or dropped, and
        forget the chain when it was the last link."""

        def done(_: Any) -> None:
            ran.set()
            link = self._last.get(key)
            if link is not None and link.ran is ran:
                del self._last[key]

        future.add_done_callback(done)
