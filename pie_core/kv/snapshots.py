"""Named snapshots of contexts, per model and user. They outlive the inferlet, not the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pie_core.kv.context import KvContext

__all__ = ["Snapshot", "SnapshotStore"]


@dataclass(slots=True)
class Snapshot:
    """A detached context (it owns its pages) plus the SDK state saved beside it."""

    kv: KvContext
    sdk_state: Any = None


class SnapshotStore:
    """Snapshots keyed by ``(model, user, name)``; one user never sees another's."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str, str], Snapshot] = {}

    def put(self, model: str, user: str, name: str, snap: Snapshot) -> None:
        """Store ``snap``, releasing whatever was saved under that name before."""
        old = self._items.pop((model, user, name), None)
        if old is not None:
            old.kv.release()
        self._items[(model, user, name)] = snap

    def get(self, model: str, user: str, name: str) -> Snapshot | None:
        return self._items.get((model, user, name))

    def pop(self, model: str, user: str, name: str) -> Snapshot | None:
        return self._items.pop((model, user, name), None)

    def names(self, model: str, user: str) -> list[str]:
        return sorted(n for (m, u, n) in self._items if m == model and u == user)

    def clear(self) -> None:
        """Release every snapshot's pages."""
        for snap in self._items.values():
            snap.kv.release()
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
