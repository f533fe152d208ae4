"""Messaging between the inferlets of one engine: broadcast topics and push/pull queues.

Every topic and queue lives in its user's namespace: a name resolves to ``(user, name)``, so
one user can neither read another's queue nor publish into another's topic. Everything is
bounded (:class:`MessagingLimits`): a message over a bound is refused with ``InvalidInput``
at the sender, never dropped, and a queue that is empty with nobody waiting on it is
forgotten, so names cost nothing once drained.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Callable

from pie_core.errors import InvalidInput

__all__ = ["Broker", "MessagingLimits", "Subscription"]

_OVERHEAD = 64  # bytes a waiting message costs beyond its text, so empty messages are not free


@dataclass(frozen=True, slots=True)
class MessagingLimits:
    """Bounds on one user's messaging (0 = no limit).

    Attributes:
        topics: Open subscriptions plus non-empty queues the user may have at once.
        message_bytes: Largest message (UTF-8 bytes).
        queue_bytes: Bytes waiting in one queue or one subscription's inbox.
        queue_messages: Messages waiting in one queue or one subscription's inbox.
    """

    topics: int = 256
    message_bytes: int = 2**20
    queue_bytes: int = 16 * 2**20
    queue_messages: int = 10_000


def _size(message: str) -> int:
    return len(message.encode("utf-8", "surrogatepass")) + _OVERHEAD


class _Backlog:
    """Messages waiting to be taken, with their byte total, under one user's limits."""

    def __init__(self) -> None:
        self.items: deque[tuple[str, int]] = deque()
        self.bytes = 0

    def check(self, size: int, limits: MessagingLimits, what: str) -> None:
        """Raise InvalidInput if one more message of ``size`` bytes would pass ``limits``."""
        if limits.queue_messages and len(self.items) >= limits.queue_messages:
            raise InvalidInput(f"{what} already holds {len(self.items)} unread messages (quota server.quotas.queue_messages); "
                               "its reader must take some before more are sent")
        if limits.queue_bytes and self.bytes + size > limits.queue_bytes:
            raise InvalidInput(f"{what} holds {self.bytes} bytes of unread messages and this one needs {size} more, over "
                               f"{limits.queue_bytes} (quota server.quotas.queue_bytes); its reader must take some first")

    def add(self, message: str, size: int) -> None:
        self.items.append((message, size))
        self.bytes += size

    def take(self) -> str:
        message, size = self.items.popleft()
        self.bytes -= size
        return message


class Subscription:
    """One subscriber's inbox on a topic. After ``release`` it yields None forever."""

    def __init__(self, broker: Broker, user: str, topic: str) -> None:
        self.topic = topic
        self._user = user
        self._broker = broker
        self._backlog = _Backlog()
        self._ready = asyncio.Event()
        self.closed = False

    async def next(self) -> str | None:
        """The next message, waiting for one; None once released and drained."""
        while not self._backlog.items:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._backlog.take()

    def release(self) -> None:
        """Unsubscribe: wake a waiting ``next`` with None."""
        if not self.closed:
            self.closed = True
            self._broker._drop(self)
            self._ready.set()


class _Queue:
    """A FIFO queue: messages waiting for a puller, or pullers waiting for a message."""

    def __init__(self) -> None:
        self.backlog = _Backlog()
        self.waiters: deque[asyncio.Future[str]] = deque()
        self.counted = False  # holds messages, so it counts toward its user's ``topics``


class Broker:
    """Topics with any number of subscribers, and named FIFO queues, per user.

    Args:
        limits_of: The bounds of a user (default: :class:`MessagingLimits` for everyone).
    """

    def __init__(self, limits_of: Callable[[str], MessagingLimits] | None = None) -> None:
        self.limits_of: Callable[[str], MessagingLimits] = limits_of or (lambda _user: MessagingLimits())
        self._subs: dict[tuple[str, str], set[Subscription]] = {}
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._in_use: dict[str, int] = {}  # per user: open subscriptions + non-empty queues

    def subscribe(self, user: str, topic: str) -> Subscription:
        """Subscribe ``user`` to its topic ``topic``.

        Raises:
            InvalidInput: The user has ``topics`` subscriptions and queues in use already.
        """
        self._claim(user, "subscribe to")
        sub = Subscription(self, user, topic)
        self._subs.setdefault((user, topic), set()).add(sub)
        return sub

    def broadcast(self, user: str, topic: str, message: str) -> int:
        """Deliver to every current subscriber of ``user``'s ``topic``; returns how many got it.

        Raises:
            InvalidInput: The message is too large, or a subscriber's inbox is full (then no
                subscriber gets it).
        """
        limits = self.limits_of(user)
        size = self._check_size(message, limits)
        subs = [s for s in self._subs.get((user, topic), ()) if not s.closed]
        for sub in subs:
            sub._backlog.check(size, limits, f"a subscriber of topic {topic!r}")
        for sub in subs:
            sub._backlog.add(message, size)
            sub._ready.set()
        return len(subs)

    def push(self, user: str, topic: str, message: str) -> None:
        """Append ``message`` to ``user``'s queue ``topic`` (or hand it to a waiting puller).

        Raises:
            InvalidInput: The message is too large, the queue is full, or a new queue would pass
                the user's ``topics`` bound.
        """
        limits = self.limits_of(user)
        size = self._check_size(message, limits)
        key = (user, topic)
        q = self._queues.get(key)
        while q is not None and q.waiters:
            waiter = q.waiters.popleft()
            if not waiter.done():
                waiter.set_result(message)
                return
        (q.backlog if q is not None else _Backlog()).check(size, limits, f"queue {topic!r}")
        if q is None or not q.counted:
            self._claim(user, "push to")
        if q is None:
            q = self._queues[key] = _Queue()
        q.counted = True
        q.backlog.add(message, size)

    async def pull(self, user: str, topic: str) -> str:
        """Wait for and remove the next message of ``user``'s queue ``topic``."""
        key = (user, topic)
        q = self._queues.get(key)
        if q is not None and q.backlog.items:
            message = q.backlog.take()
            self._settle(key, q)
            return message
        if q is None:
            q = self._queues[key] = _Queue()
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        q.waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed over, then cancelled: keep it queued
                if not q.counted:
                    q.counted = True
                    self._in_use[user] = self._in_use.get(user, 0) + 1
                q.backlog.items.appendleft((waiter.result(), _size(waiter.result())))
                q.backlog.bytes += _size(waiter.result())
            raise
        finally:
            if waiter in q.waiters:
                q.waiters.remove(waiter)
            self._settle(key, q)

    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def queue_count(self) -> int:
        """Queues with messages or pullers (drained ones are forgotten)."""
        return len(self._queues)

    def in_use(self, user: str) -> int:
        """Subscriptions plus non-empty queues ``user`` holds (what ``topics`` bounds)."""
        return self._in_use.get(user, 0)

    # internals -----------------------------------------------------------------------------

    def _check_size(self, message: str, limits: MessagingLimits) -> int:
        size = _size(message)
        if limits.message_bytes and size - _OVERHEAD > limits.message_bytes:
            raise InvalidInput(f"messages may hold at most {limits.message_bytes} bytes (quota server.quotas.message_bytes), "
                               f"got {size - _OVERHEAD}; send large data in parts or as a file")
        return size

    def _claim(self, user: str, action: str) -> None:
        held = self._in_use.get(user, 0)
        topics = self.limits_of(user).topics
        if topics and held >= topics:
            raise InvalidInput(f"user {user} has {held} of its {topics} subscriptions and non-empty queues in use "
                               f"(quota server.quotas.topics); cannot {action} another; unsubscribe or drain a queue")
        self._in_use[user] = held + 1

    def _unclaim(self, user: str) -> None:
        left = self._in_use.get(user, 0) - 1
        if left > 0:
            self._in_use[user] = left
        else:
            self._in_use.pop(user, None)

    def _settle(self, key: tuple[str, str], q: _Queue) -> None:
        # A queue that is empty with nobody waiting is forgotten: names cost nothing once drained.
        if not q.backlog.items and self._queues.get(key) is q:
            if not q.waiters:
                del self._queues[key]
            if q.counted:
                q.counted = False
                self._unclaim(key[0])

    def _drop(self, sub: Subscription) -> None:
        key = (sub._user, sub.topic)
        subs = self._subs.get(key)
        if subs is not None and sub in subs:
            subs.discard(sub)
            if not subs:
                del self._subs[key]
            self._unclaim(sub._user)
