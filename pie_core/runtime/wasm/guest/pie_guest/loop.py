"""An asyncio event loop for the guest: it waits on the host's unfinished calls.

The guest has one thread and no sockets, so the selector of a normal loop is replaced by the
host's ``poll.wait``: when no task is ready, the loop blocks in the host until one of its
started async host calls finished (or the next timer is due), then settles those calls. When
exactly one call is pending and no timer, nothing else can happen until it finishes, so the loop
skips ``poll.wait`` and takes the result at once (the ``-result`` import waits for the call).
"""

import asyncio

from componentize_py_types import Err

from pie_guest import clock
from wit_world.imports import poll as _poll

__all__ = ["GuestLoop"]


class GuestLoop(asyncio.BaseEventLoop):
    """``BaseEventLoop`` whose ``_selector`` is the host: it polls started host calls."""

    def __init__(self) -> None:
        super().__init__()
        self._selector = self
        self._calls: dict[int, tuple[object, asyncio.Future]] = {}

    def started(self, call: int, finish: object) -> asyncio.Future:
        """A future for host call number ``call``; ``finish(call)`` takes its result when done."""
        fut = self.create_future()
        self._calls[call] = (finish, fut)
        fut.add_done_callback(lambda f: self._forget(call) if f.cancelled() else None)
        return fut

    def quiet(self) -> bool:
        """Whether nothing but the running task can do anything until a host call it starts
        ends: no other callback is ready, no timer is set, no other call is pending."""
        return not self._ready and not self._scheduled and not self._calls

    def _forget(self, call: int) -> None:
        if self._calls.pop(call, None) is not None:
            _poll.cancel(call)

    def select(self, timeout: float | None) -> list:
        """Block until a started call finished or ``timeout`` seconds passed (the selector API)."""
        if not self._calls:
            if timeout is None:
                raise RuntimeError("the inferlet awaits something no host call will finish (nothing is pending)")
            clock.sleep(timeout)  # in the host: the engine can end it
            return []
        calls = list(self._calls)
        if timeout is None and len(calls) == 1:  # nothing else can happen: its -result import waits for it
            return calls
        ms = None if timeout is None else min(int(timeout * 1000), 2**32 - 1)
        return [calls[i] for i in _poll.wait(calls, ms)]

    def _process_events(self, event_list: list) -> None:
        from pie_guest.transport import error

        for call in event_list:
            finish, fut = self._calls.pop(call)
            if fut.done():
                continue
            try:
                fut.set_result(finish(call))
            except Err as exc:
                fut.set_exception(error(exc.value))

    def _write_to_self(self) -> None:
        """Nothing to wake: only this thread schedules work."""
