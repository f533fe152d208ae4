"""The guest's waits on the clock go through the host, so the engine can end them.

WASI's own clock waits (``time.sleep``, ``select.select`` and ``select.poll`` with a timeout reach
``wasi:io/poll`` through CPython's ``clock_nanosleep``/``poll_oneoff``) block inside
wasmtime's native code, where neither the epoch deadline nor a terminate can reach them: a
guest in ``time.sleep(1e6)`` would outlive its wall-time limit and keep its thread and store
after being terminated. :func:`install` replaces both with :func:`sleep`, which waits in the
host's ``poll.wait`` with no calls: the host returns early when the instance is cancelled or
reaches its wall-time limit, and the guest then traps at the next epoch tick.
"""

import select
import sys
import time

from wit_world.imports import poll as _poll

__all__ = ["install", "sleep"]

_SLICE_MS = 2**31  # poll.wait's timeout is a u32 of milliseconds
_select = select.select
_native_poll = select.poll


def sleep(seconds: float) -> None:
    """``time.sleep``: wait ``seconds`` in the host (interruptible by the engine)."""
    seconds = float(seconds)
    if seconds != seconds or seconds < 0:
        raise ValueError("sleep length must be non-negative")
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        _poll.wait([], min(_SLICE_MS, max(1, int(left * 1000))))


def _select_waiting(rlist, wlist, xlist, timeout=None):
    """``select.select``: what is ready now; a wait goes through :func:`sleep`, in slices."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        ready = _select(rlist, wlist, xlist, 0)
        if any(ready) or (end is not None and time.monotonic() >= end):
            return ready
        sleep(0.05 if end is None else min(0.05, max(0.0, end - time.monotonic())))


class _Poll:
    """``select.poll()``: the native poll object, asked with no timeout; a wait goes through
    :func:`sleep`, in slices."""

    def __init__(self) -> None:
        self._poll = _native_poll()

    def register(self, *args):
        return self._poll.register(*args)

    def modify(self, *args):
        return self._poll.modify(*args)

    def unregister(self, *args):
        return self._poll.unregister(*args)

    def poll(self, timeout=None):
        end = None if timeout is None or timeout < 0 else time.monotonic() + timeout / 1000
        while True:
            ready = self._poll.poll(0)
            if ready or (end is not None and time.monotonic() >= end):
                return ready
            sleep(0.05 if end is None else min(0.05, max(0.0, end - time.monotonic())))


def install() -> None:
    """Route ``time.sleep``, ``select.select`` and ``select.poll`` (the selectors' too) through
    the host."""
    time.sleep = sleep
    select.select = _select_waiting
    select.poll = _Poll
    selectors = sys.modules.get("selectors")
    if selectors is not None:  # imported with asyncio, before this ran: its classes hold the native ones
        selectors.PollSelector._selector_cls = _Poll
