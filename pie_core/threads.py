"""Threads that run what users ask for, below the server's own priority."""

from __future__ import annotations

import os
import threading

__all__ = ["USER_WORK_NICE", "lower_priority"]

USER_WORK_NICE = 10
"""Scheduling niceness of threads doing users' heavy work (grammar compilation, big bodies, big
worker frames): as the process runner's workers (nice +10), it yields the CPU to the event loop
and the backend thread. Linux schedules threads, so it applies to the calling thread alone."""


def lower_priority() -> None:
    """Raise the calling thread's niceness by :data:`USER_WORK_NICE`, to at most 19 (a
    ``ThreadPoolExecutor`` initializer); where threads cannot be reniced (not Linux, or not
    allowed), it keeps the process's priority."""
    try:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + USER_WORK_NICE))
    except (AttributeError, OSError):
        pass
