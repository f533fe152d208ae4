"""Per-user quotas of ``pie serve``: what one user may hold at once, so no user starves another.

Every user gets the same :class:`Quotas` (the ``[server.quotas]`` table of ``~/.pie/config.toml``)
unless ``[server.quotas.users.<name>]`` overrides some keys for that user. docs/server.md
("Quotas") lists each key, its default and what happens when it is reached.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pie_core import safepath
from pie_core.engine.broker import MessagingLimits
from pie_core.errors import InvalidInput
from pie_core.scheduler.credits import DEFAULT_ENDOWMENT

__all__ = ["Quotas", "ConnectionCounts", "ScratchSizes", "DEFAULT_PAGE_SHARE", "DEFAULT_CREDITS"]

# A lone user keeps three quarters of the KV cache (long contexts, many forks), and however
# greedy one user is, a quarter always stays for everyone else.
DEFAULT_PAGE_SHARE = 0.75

# Four inferlets' endowments at once per model: a user running more splits the same credit,
# so its weight in the KV-page market does not grow with how many inferlets it starts.
DEFAULT_CREDITS = 4 * DEFAULT_ENDOWMENT

_MESSAGING = MessagingLimits()
_BYTE_KEYS = ("event_bytes", "inbox_bytes", "scratch_bytes", "message_bytes", "queue_bytes", "adapter_bytes",
              "memory_bytes")
_COUNT_KEYS = ("snapshots", "processes", "spawn_depth", "connections", "topics", "queue_messages")


@dataclass(frozen=True, slots=True)
class Quotas:
    """What one user may hold at once. ``0`` means no limit for every key but ``pages``.

    Attributes:
        pages: KV pages held at once in one model's pool, by the user's live contexts and
            snapshots together (a page shared by several holders counts for each): a count, or
            a share of the pool when a float in (0, 1].
        credits: Endowments a user's live inferlets hold together in one model's KV-page
            market (credits; :class:`~pie_core.scheduler.credits.Ledger` ``budget_of``). An
            inferlet that joins when they are spent starts with what is left, possibly 0.
        snapshots: Saved context snapshots (all models).
        processes: Inferlets running at once, spawned children included.
        spawn_depth: How deep ``runtime.spawn`` may nest.
        event_bytes: Bytes of events one process may have buffered but not yet delivered.
        inbox_bytes: Bytes of client messages and files queued for one process and not yet
            received by it (each message counts 64 bytes on top of its size).
        scratch_bytes: Size of the user's scratch directory, checked at each launch.
        adapter_bytes: float32 bytes of the LoRA adapters a user holds at once (all models).
        memory_bytes: Resident memory (PSS) of the user's worker processes together, checked
            every second; over it, the largest is killed (:mod:`pie_core.server.memory`).
        connections: Open WebSocket connections and HTTP requests in flight.
        topics: Messaging subscriptions plus non-empty queues.
        message_bytes: Largest message one ``broadcast`` or ``push`` may carry.
        queue_bytes: Bytes waiting in one queue or one subscription.
        queue_messages: Messages waiting in one queue or one subscription.
        overrides: ``{user: {key: value}}`` read from ``[server.quotas.users.<name>]``.
    """

    pages: int | float = DEFAULT_PAGE_SHARE
    credits: float = DEFAULT_CREDITS
    snapshots: int = 64
    processes: int = 128
    spawn_depth: int = 4
    event_bytes: int = 64 * 2**20
    inbox_bytes: int = 128 * 2**20
    scratch_bytes: int = 2**30
    adapter_bytes: int = 256 * 2**20
    memory_bytes: int = 8 * 2**30
    connections: int = 256
    topics: int = _MESSAGING.topics
    message_bytes: int = _MESSAGING.message_bytes
    queue_bytes: int = _MESSAGING.queue_bytes
    queue_messages: int = _MESSAGING.queue_messages
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in _BYTE_KEYS + _COUNT_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"quota server.quotas.{key} must be a whole number >= 0 (0 = no limit), got {value!r}")
        pages = self.pages
        if isinstance(pages, bool) or not isinstance(pages, (int, float)):
            raise InvalidInput(f"quota server.quotas.pages must be a page count or a share such as 0.5, got {pages!r}")
        if isinstance(pages, float) and not 0 < pages <= 1:
            raise InvalidInput(f"quota server.quotas.pages as a share of the pool must be in (0, 1], got {pages}")
        if isinstance(pages, int) and pages < 1:
            raise InvalidInput(f"quota server.quotas.pages must be >= 1 page, got {pages}")
        credits = self.credits
        if isinstance(credits, bool) or not isinstance(credits, (int, float)) or not 0 <= credits < math.inf:
            raise InvalidInput(f"quota server.quotas.credits must be a finite number of credits >= 0 (0 = no limit), "
                               f"got {credits!r}")

    def pages_of(self, pool_pages: int) -> int:
        """The page quota in a pool of ``pool_pages`` pages (at least one page)."""
        if isinstance(self.pages, float):
            return max(1, int(pool_pages * self.pages))
        return self.pages

    def credits_of(self) -> float | None:
        """The credit budget in one model's market (None: no limit), as ``Ledger.budget_of`` returns it."""
        return float(self.credits) if self.credits else None

    def for_user(self, user: str) -> Quotas:
        """The quotas of ``user``: these, with that user's overrides applied."""
        extra = self.overrides.get(user)
        if not extra:
            return self
        return dataclasses.replace(self, **extra, overrides={})

    def messaging(self) -> MessagingLimits:
        """The messaging bounds as the broker takes them."""
        return MessagingLimits(topics=self.topics, message_bytes=self.message_bytes, queue_bytes=self.queue_bytes,
                               queue_messages=self.queue_messages)

    @classmethod
    def from_config(cls, doc: Any = None) -> Quotas:
        """Quotas from the ``[server.quotas]`` table of ``~/.pie/config.toml`` (``doc`` when
        given), with per-user overrides from ``[server.quotas.users.<name>]``. Byte keys take
        sizes such as ``"1GiB"``; ``pages`` takes a count or a share such as ``0.5``; ``credits``
        takes a number of credits; unset keys keep the defaults.

        Raises:
            InvalidInput: An unknown key or a bad value (the message names it).
        """
        from pie_core import config

        table = config.get("server.quotas", doc if doc is not None else config.load_config(), None) or {}
        if not isinstance(table, dict):
            raise InvalidInput("server.quotas must be a table ([server.quotas] in config.toml)")
        users = table.pop("users", {}) or {}
        if not isinstance(users, dict) or not all(isinstance(v, dict) for v in users.values()):
            raise InvalidInput("server.quotas.users must hold one table per user ([server.quotas.users.NAME])")
        base = cls(**_parse(table, "server.quotas"))
        overrides = {name: _parse(values, f"server.quotas.users.{name}") for name, values in users.items()}
        return dataclasses.replace(base, overrides=overrides)


def _parse(table: dict[str, Any], where: str) -> dict[str, Any]:
    from pie_core import config

    known = {f.name for f in dataclasses.fields(Quotas)} - {"overrides"}
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise InvalidInput(f"unknown quota {where}.{key}; known keys: {', '.join(sorted(known))}")
        if key in _BYTE_KEYS and isinstance(value, str):
            try:
                value = config.parse_bytes(value)
            except InvalidInput as exc:
                raise InvalidInput(f"quota {where}.{key}: {exc}") from None
        out[key] = value
    try:
        Quotas(**out)
    except InvalidInput as exc:
        raise InvalidInput(f"{exc} (in {where})") from None
    return out


class ScratchSizes:
    """The size of each user's scratch directory (``<root>/<user>``), measured in a thread.

    :meth:`size` answers from the last measurement at once and starts a new one, so the event
    loop never walks a directory; a process that ends triggers one too (:meth:`refresh`).
    """

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._sizes: dict[str, int] = {}
        self._busy: dict[str, asyncio.Future[None]] = {}
        self._again: set[str] = set()

    def folder(self, user: str) -> Path | None:
        if self.root is None or not re.fullmatch(r"[A-Za-z0-9_.@-]+", user) or user in (".", ".."):
            return None
        return self.root / user

    def size(self, user: str) -> int:
        """Bytes in ``user``'s scratch directory at the last measurement (0 before the first)."""
        self.refresh(user)
        return self._sizes.get(user, 0)

    def sizes(self) -> dict[str, int]:
        """The last measurement of every user measured so far."""
        return dict(self._sizes)

    def refresh(self, user: str) -> asyncio.Future[None] | None:
        """Start measuring ``user``'s directory off the loop (one measurement at a time per user)."""
        folder = self.folder(user)
        if folder is None:
            return None
        if user in self._busy:  # measure once more when this one ends: it may predate the writes
            self._again.add(user)
            return self._busy[user]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None

        def store(fut: asyncio.Future[int]) -> None:
            self._busy.pop(user, None)
            if not fut.cancelled() and fut.exception() is None:
                self._sizes[user] = fut.result()
            if user in self._again and not loop.is_closed():
                self._again.discard(user)
                self.refresh(user)

        fut = loop.run_in_executor(None, _tree_bytes, folder)
        fut.add_done_callback(store)
        self._busy[user] = fut  # type: ignore[assignment]
        return fut  # type: ignore[return-value]


_MAX_WALK_DEPTH = 256  # folders deeper are not counted (a path walk stops near there too: PATH_MAX)


def _tree_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder``, walked through directory descriptors, one
    per level of the current path (a folder swapped for a link mid-walk is refused, never
    followed; vanished files are skipped)."""
    total = 0
    stack: list[tuple[int, Any]] = []
    try:
        root = safepath.open_root(folder)
        try:
            stack.append((root, os.scandir(root)))
        except OSError:
            os.close(root)
            raise
        while stack:
            fd, it = stack[-1]
            entry = next(it, None)
            if entry is None:
                it.close()
                os.close(stack.pop()[0])
                continue
            try:
                if entry.is_dir(follow_symlinks=False) and len(stack) < _MAX_WALK_DEPTH:
                    child = safepath.open_dir(fd, (entry.name,))
                    try:
                        stack.append((child, os.scandir(child)))
                    except OSError:
                        os.close(child)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    except OSError:
        pass
    finally:
        for fd, it in stack:
            it.close()
            os.close(fd)
    return total


class ConnectionCounts:
    """Open connections per user (quota ``connections``) and unauthenticated ones (a global cap).

    A connection is a key (the WebSocket connection, or any object for an HTTP request); it
    counts as anonymous until :meth:`authenticate` names its user.
    """

    def __init__(self, quotas: Quotas, max_anonymous: int) -> None:
        self.quotas = quotas
        self.max_anonymous = max_anonymous
        self.anonymous = 0
        self._per_user: dict[str, int] = {}
        self._holders: dict[object, str | None] = {}

    def of_user(self) -> dict[str, int]:
        return dict(self._per_user)

    def enter(self, key: object, user: str | None) -> None:
        """Count a new connection of ``user`` (None: not authenticated yet).

        Raises:
            InvalidInput: The user (or the unauthenticated pool) is at its cap; nothing is counted.
        """
        if user is None:
            if self.max_anonymous and self.anonymous >= self.max_anonymous:
                raise InvalidInput(f"{self.anonymous} connections wait for authentication already; "
                                   "send the token in the Authorization header")
            self.anonymous += 1
            self._holders[key] = None
            return
        self._claim(user)
        self._holders[key] = user

    def authenticate(self, key: object, user: str) -> None:
        """Move an anonymous connection to ``user``'s count (no-op if it is counted already).

        Raises:
            InvalidInput: ``user`` has as many connections open as its quota; the connection
                stays anonymous.
        """
        if key not in self._holders or self._holders[key] is not None:
            return
        self._claim(user)
        self._holders[key] = user
        self.anonymous -= 1

    def leave(self, key: object) -> None:
        """The connection closed."""
        if key not in self._holders:
            return
        user = self._holders.pop(key)
        if user is None:
            self.anonymous -= 1
            return
        left = self._per_user[user] - 1
        if left:
            self._per_user[user] = left
        else:
            del self._per_user[user]

    def _claim(self, user: str) -> None:
        held, limit = self._per_user.get(user, 0), self.quotas.for_user(user).connections
        if limit and held >= limit:
            raise InvalidInput(f"user {user} has {held} of its {limit} connections open "
                               "(quota server.quotas.connections); close one first")
        self._per_user[user] = held + 1
