"""Messaging between the inferlets of one engine: broadcast topics and push/pull queues."""

from __future__ import annotations

import asyncio
from collections import defaultdict

__all__ = ["Broker", "Subscription"]


class Subscription:
    """One subscriber's inbox on a topic. After ``close`` it yields None forever."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.topic = topic
        self._broker = broker
        self._inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.closed = False

    def deliver(self, message: str) -> None:
        if not self.closed:
            self._inbox.put_nowait(message)

    async def next(self) -> str | None:
        if self.closed and self._inbox.empty():
            return None
        return await self._inbox.get()

    def release(self) -> None:
        """Unsubscribe: wake a waiting ``next`` with None."""
        if not self.closed:
            self.closed = True
            self._broker.drop(self)
            self._inbox.put_nowait(None)


class Broker:
    """Topics with any number of subscribers, and named FIFO queues."""

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = defaultdict(set)
        self._queues: dict[str, asyncio.Queue[str]] = {}

    def subscribe(self, topic: str) -> Subscription:
        sub = Subscription(self, topic)
        self._subs[topic].add(sub)
        return sub

    def drop(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.topic)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.topic]

    def broadcast(self, topic: str, message: str) -> int:
        """Deliver to every current subscriber; returns how many got it."""
        subs = list(self._subs.get(topic, ()))
        for sub in subs:
            sub.deliver(message)
        return len(subs)

    def push(self, topic: str, message: str) -> None:
        self._queue(topic).put_nowait(message)

    async def pull(self, topic: str) -> str:
        return await self._queue(topic).get()

    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def _queue(self, topic: str) -> asyncio.Queue[str]:
        q = self._queues.get(topic)
        if q is None:
            q = self._queues[topic] = asyncio.Queue()
        return q
