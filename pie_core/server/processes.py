"""Running inferlets of the server, per user, with their event buffers and attachments.

Every event a process emits gets a sequence number and waits in the process's buffer until it
has been sent to an attached connection; only a successful send removes it. While nobody is
attached the buffer grows (bounded by ``max_buffered``), and attaching again replays it in
order, so no event is lost between detach and reattach.

A process launched by a connection ends with that connection unless it was detached: a client
that drops mid-generation gets its process cancelled and every page returned. A finished
process leaves the table once its last event is delivered (or, if detached, after
``retain_s`` seconds without anyone attaching).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pie_core.errors import InvalidInput, NotFound
from pie_core.host.binding import HostInstance
from pie_core.runtime.engine import Engine
from pie_core.runtime.events import Event
from pie_core.runtime.manifest import Manifest
from pie_core.server.launcher import Launcher
from pie_core.server.mcp_relay import ConnectionRelay
from pie_core.server.protocol import event_frame

__all__ = ["Sink", "Process", "ProcessTable"]


class Sink(Protocol):
    """Where a process's events go: a client connection (``websockets`` connections fit)."""

    async def send(self, message: bytes) -> None: ...


@dataclass(eq=False)
class Process:
    """One launched inferlet."""

    id: str
    user: str
    program: str
    instance: HostInstance
    started: float = field(default_factory=time.time)
    task: asyncio.Task[Event] | None = None
    owner: Sink | None = None  # the connection it ends with, until detached
    attached: Sink | None = None
    finished_at: float | None = None
    pending: deque[tuple[int, str, Any]] = field(default_factory=deque)
    seq: int = 0
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _pump: asyncio.Task[None] | None = None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def state(self) -> str:
        if self.finished:
            return "finished"
        return "attached" if self.attached is not None else "detached"

    def describe(self) -> dict[str, Any]:
        return {
            "process": self.id,
            "program": self.program,
            "state": self.state,
            "started": self.started,
            "buffered": len(self.pending),
        }


class ProcessTable:
    """All processes of a server; every lookup is by ``(user, id)``, so users stay apart."""

    def __init__(self, engine: Engine, launcher: Launcher, *, max_buffered: int = 10_000, retain_s: float = 3600.0,
                 scratch_root: Path | None = None) -> None:
        self.engine = engine
        self.scratch_root = scratch_root
        self.launcher = launcher
        self.max_buffered = max_buffered
        self.retain_s = retain_s
        self._procs: dict[str, Process] = {}

    def __len__(self) -> int:
        return len(self._procs)

    def running_count(self) -> int:
        return sum(1 for p in self._procs.values() if not p.finished)

    def launch(self, user: str, manifest: Manifest, args: dict[str, Any], sink: Sink,
               relay: ConnectionRelay | None = None) -> Process:
        """Start ``manifest``'s inferlet for ``user``, attached to (and owned by) ``sink``; it
        reaches the MCP servers registered on ``relay`` (its launching connection's) until it ends."""
        pid = uuid.uuid4().hex[:12]
        proc = Process(pid, user, f"{manifest.name}@{manifest.version}", instance=None)  # type: ignore[arg-type]
        proc.instance = HostInstance(engine=self.engine, emit=lambda ev: self._emit(proc, ev), username=user, id=pid,
                                     scratch_root=self.scratch_root)
        self._procs[pid] = proc
        proc.owner = sink
        self.attach(user, pid, sink)
        if relay is not None:
            self.engine.mcp.attach_relay(pid, relay.bound(pid))
        proc.task = self.launcher.start(self.engine, manifest, args, proc.instance)
        proc.task.add_done_callback(lambda _t: self._finished(proc))
        return proc

    def get(self, user: str, pid: Any) -> Process:
        """The process ``pid`` of ``user``.

        Raises:
            NotFound: No such process for this user (another user's id reads the same).
        """
        proc = self._procs.get(pid) if isinstance(pid, str) else None
        if proc is None or proc.user != user:
            raise NotFound(f"no process {pid!r} of user {user!r}; list_processes shows yours")
        return proc

    def of_user(self, user: str) -> list[Process]:
        return [p for p in self._procs.values() if p.user == user]

    def all(self) -> list[Process]:
        return list(self._procs.values())

    def attach(self, user: str, pid: str, sink: Sink) -> int:
        """Route ``pid``'s events to ``sink`` (taking it over from any other connection);
        returns how many buffered events are replayed."""
        proc = self.get(user, pid)
        self._stop_pump(proc)
        proc.attached = sink
        proc._pump = asyncio.get_running_loop().create_task(self._pump(proc, sink), name=f"pie-pump-{pid}")
        return len(proc.pending)

    def detach(self, user: str, pid: str) -> None:
        """Stop sending ``pid``'s events (they buffer) and let it outlive its connection."""
        proc = self.get(user, pid)
        self._stop_pump(proc)
        proc.attached = None
        proc.owner = None

    def deliver_message(self, user: str, pid: str, text: str) -> None:
        """Queue ``text`` for the process's ``session.receive()`` (messages and signals)."""
        proc = self._running(user, pid)
        proc.instance.inbox.put_nowait(text)

    def deliver_file(self, user: str, pid: str, data: bytes) -> None:
        """Queue ``data`` for the process's ``session.receive_file()``."""
        self._running(user, pid).instance.files.put_nowait(data)

    def terminate(self, user: str, pid: str, reason: str = "terminated by client") -> None:
        """Cancel the process; its client gets an Error event carrying ``reason``."""
        proc = self._running(user, pid)
        assert proc.task is not None
        proc.task.cancel(reason)

    def connection_closed(self, sink: Sink) -> None:
        """A client went away: processes it owns are cancelled, others it watched detach."""
        for proc in list(self._procs.values()):
            if proc.attached is sink:
                self._stop_pump(proc)
                proc.attached = None
            if proc.owner is sink:
                proc.owner = None
                if proc.finished:
                    self._forget(proc)
                elif proc.task is not None:
                    proc.task.cancel("client disconnected")
                    proc.task.add_done_callback(self._forgetter(proc))

    def sweep(self, now: float | None = None) -> int:
        """Drop finished, detached processes older than ``retain_s``; returns how many."""
        now = time.time() if now is None else now
        old = [p for p in self._procs.values() if p.finished and p.attached is None and now - (p.finished_at or now) > self.retain_s]
        for proc in old:
            self._forget(proc)
        return len(old)

    async def shutdown(self, reason: str = "server shutting down", flush_s: float = 2.0) -> None:
        """Cancel every running process (each emits an Error event with ``reason``), give
        attached clients up to ``flush_s`` seconds to receive their last events, then close the
        launcher."""
        tasks = [p.task for p in self._procs.values() if p.task is not None and not p.task.done()]
        for task in tasks:
            task.cancel(reason)
        if tasks:
            await asyncio.wait(tasks, timeout=flush_s)
        deadline = time.monotonic() + flush_s
        while any(p.pending and p.attached is not None for p in self._procs.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for proc in list(self._procs.values()):
            self._stop_pump(proc)
        self._procs.clear()
        await self.launcher.aclose()

    # internals -----------------------------------------------------------------------------

    def _forgetter(self, proc: Process) -> Callable[[Any], None]:
        return lambda _task: self._forget(proc)

    def _running(self, user: str, pid: str) -> Process:
        proc = self.get(user, pid)
        if proc.finished:
            raise InvalidInput(f"process {pid} has finished; it no longer takes messages, files or signals")
        return proc

    def _emit(self, proc: Process, event: Event) -> None:
        proc.seq += 1
        proc.pending.append((proc.seq, event.kind, event.value))
        proc._wakeup.set()
        if len(proc.pending) > self.max_buffered and proc.task is not None and not proc.task.done():
            proc.task.cancel(f"more than {self.max_buffered} events buffered while detached; attach to drain them")

    def _finished(self, proc: Process) -> None:
        proc.finished_at = time.time()
        self.engine.mcp.detach_relay(proc.id)
        proc._wakeup.set()
        if not proc.pending and proc.attached is not None:
            self._forget(proc)

    def _forget(self, proc: Process) -> None:
        self._stop_pump(proc)
        self._procs.pop(proc.id, None)

    def _stop_pump(self, proc: Process) -> None:
        pump, proc._pump = proc._pump, None
        if pump is not None and pump is not asyncio.current_task():
            pump.cancel()

    async def _pump(self, proc: Process, sink: Sink) -> None:
        """Send buffered events in order; an event leaves the buffer only once sent."""
        try:
            while True:
                while proc.pending:
                    seq, kind, value = proc.pending[0]
                    await sink.send(event_frame(proc.id, seq, kind, value))
                    proc.pending.popleft()
                if proc.finished:
                    self._forget(proc)
                    return
                proc._wakeup.clear()
                await proc._wakeup.wait()
        except asyncio.CancelledError:
            raise
        except Exception:  # the connection broke: stay buffered until someone attaches
            if proc.attached is sink:
                proc.attached = None
