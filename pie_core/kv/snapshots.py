"""Named snapshots of contexts, per model and user. They outlive the inferlet, not the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pie_core.errors import InvalidInput
from pie_core.kv.context import KvContext

__all__ = ["Snapshot", "SnapshotStore"]


@dataclass(slots=True)
class Snapshot:
    """A detached context (it owns its pages) plus the SDK state saved beside it: the tokens
    its buffer held and its conversation builder (a ``ChatBuilder``, or None)."""

    kv: KvContext
    buffer: list[int] = field(default_factory=list)
    chat: Any = None


class SnapshotStore:
    """Snapshots keyed by ``(model, user, name)``; one user never sees another's.

    A snapshot's pages stay charged to its user's page account after the inferlet ends;
    ``limit_of(user)`` (set by the server; None = unlimited) bounds how many a user keeps.
    """

    def __init__(self) -> None:
        self._items: dict[tuple[str, str, str], Snapshot] = {}
        self._per_user: dict[str, int] = {}
        self.limit_of: Callable[[str], int | None] | None = None

    def counts(self) -> dict[str, int]:
        """Snapshots per user, for every user who keeps any."""
        return dict(self._per_user)

    def count(self, user: str) -> int:
        """Snapshots ``user`` keeps, over every model."""
        return self._per_user.get(user, 0)

    def check_room(self, model: str, user: str, name: str) -> None:
        """Raise unless ``user`` may save one more snapshot under ``name``.

        Raises:
            InvalidInput: ``name`` is new and the user keeps as many snapshots as its quota.
        """
        limit = None if self.limit_of is None else self.limit_of(user)
        held = self.count(user)
        if limit and held >= limit and (model, user, name) not in self._items:
            raise InvalidInput(f"user {user} keeps {held} of its {limit} snapshots (quota server.quotas.snapshots); "
                               "delete one (delete_snapshot) or save under an existing name")

    def put(self, model: str, user: str, name: str, snap: Snapshot) -> None:
        """Store ``snap``, releasing whatever was saved under that name before."""
        old = self.pop(model, user, name)
        if old is not None:
            old.kv.release()
        self._items[(model, user, name)] = snap
        self._per_user[user] = self._per_user.get(user, 0) + 1

    def get(self, model: str, user: str, name: str) -> Snapshot | None:
        return self._items.get((model, user, name))

    def pop(self, model: str, user: str, name: str) -> Snapshot | None:
        snap = self._items.pop((model, user, name), None)
        if snap is not None:
            left = self._per_user[user] - 1
            if left:
                self._per_user[user] = left
            else:
                del self._per_user[user]
        return snap

    def names(self, model: str, user: str) -> list[str]:
        return sorted(n for (m, u, n) in self._items if m == model and u == user)

    def clear(self) -> None:
        """Release every snapshot's pages."""
        for snap in self._items.values():
            snap.kv.release()
        self._items.clear()
        self._per_user.clear()

    def __len__(self) -> int:
        return len(self._items)
