"""Threads that run what users ask for, below the server's own priority."""

from __future__ import annotations

import os

__all__ = ["USER_WORK_NICE", "lower_priority"]

USER_WORK_NICE = 10
"""Scheduling niceness of threads doing users' heavy work (grammar compilation, big bodies, big
worker frames): as the process runner's workers (nice +10), it yields the CPU to the event loop
and the backend thread. Linux schedules threads, so it applies to the calling thread alone."""


def lower_priority() -> None:
    """Raise the calling thread's niceness by :data:`USER_WORK_NICE`, to at most 19 (a
    ``ThreadPoolExecutor`` initializer). ``nice(2)`` changes the calling thread alone on Linux and
    clamps at 19 itself; it needs no permission to lower a priority, where ``setpriority`` on a
    thread id can be refused by a container's filter. Where it fails, the thread keeps the
    process's priority."""
    try:
        os.nice(USER_WORK_NICE)
    except OSError:
        pass
