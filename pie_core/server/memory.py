"""The per-user memory quota across worker processes (``server.quotas.memory_bytes``).

Each worker is capped on its own (``RLIMIT_AS``, ``[worker] memory_mb``), but a user running
many workers holds their sum. :class:`MemoryWatch` adds up, every :data:`CHECK_S` seconds, the
proportional resident memory (PSS) of each user's running workers, spawned children included;
a user over its quota loses its largest worker (the one holding the most), which ends with an
Error event saying so, then the next largest, until the rest fit. A wasm guest runs in the
server's process: its linear memory is capped per guest by the store's limits and not counted
here; in-process inferlets are trusted and not counted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from pie_core.server.quotas import Quotas

__all__ = ["MemoryWatch", "CHECK_S"]

CHECK_S = 1.0
"""Seconds between two looks at the users' workers."""

_MiB = 2**20
log = logging.getLogger("pie.server.memory")


class MemoryWatch:
    """Enforces ``memory_bytes`` of ``quotas`` over ``launcher``'s workers (a launcher with
    ``users()`` and ``workers_of(user)``: the process launcher)."""

    def __init__(self, launcher: Any, quotas: Callable[[], Quotas]) -> None:
        self.launcher, self.quotas = launcher, quotas

    @staticmethod
    def applies(launcher: Any) -> bool:
        return hasattr(launcher, "workers_of") and hasattr(launcher, "users")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await asyncio.to_thread(self.check)  # reading each worker's smaps_rollup: off the loop
            except Exception:  # noqa: BLE001 - a failed look must not end the watch
                log.exception("the memory watch failed; it looks again in %ss", CHECK_S)

    def check(self) -> list[Any]:
        """Kill the largest workers of each user over its quota; returns those killed."""
        killed = []
        for user in self.launcher.users():
            limit = self.quotas().for_user(user).memory_bytes
            if not limit:
                continue
            sizes = sorted(((w.memory_bytes(), w.started_at, w) for w in self.launcher.workers_of(user)),
                           key=lambda t: (t[0], t[1]), reverse=True)
            total = sum(size for size, _, _ in sizes)
            for size, _, worker in sizes:
                if total <= limit:
                    break
                worker.kill(f"killed: user {user}'s inferlets held {total // _MiB} MiB of memory together, over "
                            f"its {limit // _MiB} MiB quota (server.quotas.memory_bytes); this one held the most, "
                            f"{size // _MiB} MiB. Run fewer at once, or hold less in each")
                killed.append(worker)
                total -= size
        return killed
