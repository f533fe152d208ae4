"""Running inferlets of the server, per user, with their event buffers and attachments.

Every event a process emits gets a sequence number and waits in the process's buffer until it
has been sent to an attached connection; only a successful send removes it. While nobody is
attached the buffer grows, and attaching again replays it in order, so no event is lost between
detach and reattach. The buffer is bounded by ``max_buffered`` events and by the user's
``event_bytes`` quota: a process past either is cancelled with an Error event saying which.
Messages and files from the client wait in the process's inbox, bounded by ``inbox_bytes``:
one that does not fit is refused at once with ``InvalidInput``.

A process launched by a connection ends with that connection unless it was detached: a client
that drops mid-generation gets its process cancelled and every page returned. A finished
process leaves the table once its last event is delivered (or, if detached, after
``retain_s`` seconds without anyone attaching).
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pie_core.engine.engine import Engine
from pie_core.engine.placement import Demand
from pie_core.engine.events import Event
from pie_core.errors import InvalidInput, NotFound
from pie_core.host.binding import HostInstance, SpawnBudget
from pie_core.runtime.launcher import Launcher
from pie_core.runtime.manifest import Manifest
from pie_core.server.mcp_relay import ConnectionRelay
from pie_core.server.protocol import event_frame
from pie_core.server.quotas import Quotas, ScratchSizes

__all__ = ["Sink", "Process", "ProcessTable"]


def _spawnable(resolve: Callable[[str, str], Manifest], user: str, ref: str) -> Manifest:
    """``runtime.spawn``'s lookup under ``pie serve``: ``ref`` as ``user``'s own launch resolves
    it, never a path (refused alike whether or not the path exists)."""
    if re.search(r"[/\\~]|^\.", ref):
        raise InvalidInput(f"runtime.spawn takes a program name ('name' or 'name@version') under pie serve, "
                           f"not a path: {ref!r}; install the program first and spawn it by name")
    return resolve(user, ref)


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
    pending_bytes: int = 0
    overflowed: bool = False  # cancelled for buffering too much: later events are dropped
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
            "buffered_bytes": self.pending_bytes,
        }


class ProcessTable:
    """All processes of a server; every lookup is by ``(user, id)``, so users stay apart.

    ``quotas`` bounds each user (its ``for_user`` overrides apply): processes running at once,
    event and inbox bytes per process, scratch size at launch.
    """

    def __init__(self, engine: Engine, launcher: Launcher, *, max_buffered: int = 10_000, retain_s: float = 3600.0,
                 scratch_root: Path | None = None, quotas: Quotas | None = None,
                 resolve: Callable[[str, str], Manifest] | None = None) -> None:
        self.engine = engine
        self.resolve = resolve  # (user, name) -> manifest, as a launch resolves it; runtime.spawn uses it
        self._spawns: dict[str, SpawnBudget] = {}  # per user: its spawned children running now
        self.scratch_root = scratch_root
        self.quotas = quotas or Quotas()
        self.scratch = ScratchSizes(scratch_root)
        self.launcher = launcher
        self.max_buffered = max_buffered
        self.retain_s = retain_s
        self._procs: dict[str, Process] = {}

    def __len__(self) -> int:
        return len(self._procs)

    def running_count(self) -> int:
        return sum(1 for p in self._procs.values() if not p.finished)

    def launch(self, user: str, manifest: Manifest, args: dict[str, Any], sink: Sink,
               relay: ConnectionRelay | None = None, demand: Demand | None = None) -> Process:
        """Start ``manifest``'s inferlet for ``user``, attached to (and owned by) ``sink``; it
        reaches the MCP servers registered on ``relay`` (its launching connection's) until it ends.
        ``demand``: what placement knows of it (an OpenAI request's prompt pages), if anything.

        Raises:
            InvalidInput: The user runs as many processes as its quota allows, or its scratch
                directory is over its quota.
        """
        quotas = self.quotas.for_user(user)
        running = self.running_of(user)
        if quotas.processes and running >= quotas.processes:
            raise InvalidInput(f"user {user} runs {running} of its {quotas.processes} processes (quota server.quotas.processes); "
                               "wait for one to finish or terminate one")
        used = self.scratch.size(user)
        if quotas.scratch_bytes and used > quotas.scratch_bytes:
            raise InvalidInput(f"user {user}'s scratch directory holds {used} bytes, over its {quotas.scratch_bytes}-byte quota "
                               "(server.quotas.scratch_bytes); launches are refused until files there are removed "
                               f"(the server operator can clear {self.scratch.folder(user)})")
        pid = uuid.uuid4().hex[:12]
        proc = Process(pid, user, f"{manifest.name}@{manifest.version}", instance=None)  # type: ignore[arg-type]
        spawns = self._spawns.setdefault(user, SpawnBudget())
        spawns.processes, spawns.spawn_depth = quotas.processes, quotas.spawn_depth
        resolve = None if self.resolve is None else functools.partial(_spawnable, self.resolve, user)
        proc.instance = HostInstance(engine=self.engine, emit=lambda ev: self._emit(proc, ev), username=user, id=pid,
                                     scratch_root=self.scratch_root, spawns=spawns, resolve_program=resolve)
        proc.instance.demand = demand
        inbox = InboxBytes(quotas.inbox_bytes)
        proc.instance.inbox, proc.instance.files = MeteredQueue(inbox), MeteredQueue(inbox)
        self._procs[pid] = proc
        proc.owner = sink
        self.attach(user, pid, sink)
        if relay is not None:
            self.engine.mcp.attach_relay(pid, relay.bound(pid))
        proc.task = self.launcher.start(self.engine, manifest, args, proc.instance)
        proc.task.add_done_callback(lambda _t: self._finished(proc))
        return proc

    def running_of(self, user: str) -> int:
        """Inferlets of ``user`` running now: launched ones and their spawned children."""
        spawned = self._spawns[user].running if user in self._spawns else 0
        return spawned + sum(1 for p in self._procs.values() if p.user == user and not p.finished)

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
        """Queue ``text`` for the process's ``session.receive()`` (messages and signals).

        Raises:
            InvalidInput: The inbox is full (quota ``inbox_bytes``); nothing is queued.
        """
        _offer(self._running(user, pid).instance.inbox, text, "message")

    def deliver_file(self, user: str, pid: str, data: bytes) -> None:
        """Queue ``data`` for the process's ``session.receive_file()``.

        Raises:
            InvalidInput: The inbox is full (quota ``inbox_bytes``); nothing is queued.
        """
        _offer(self._running(user, pid).instance.files, data, "file")

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
        size = event_bytes(event.value)
        if not event.is_terminal:
            if proc.overflowed:
                return  # the process is being cancelled for buffering too much
            limit = self.quotas.for_user(proc.user).event_bytes
            if limit and proc.pending_bytes + size > limit:
                self._overflow(proc, f"its {proc.pending_bytes + size} bytes of undelivered events passed the {limit}-byte "
                                     "quota (server.quotas.event_bytes); attach and read events as they come, or send less")
                return
        proc.seq += 1
        proc.pending.append((proc.seq, event.kind, event.value))
        proc.pending_bytes += size
        proc._wakeup.set()
        if len(proc.pending) > self.max_buffered:
            self._overflow(proc, f"more than {self.max_buffered} events buffered while detached; attach to drain them")

    def _overflow(self, proc: Process, reason: str) -> None:
        proc.overflowed = True
        if proc.task is not None and not proc.task.done():
            proc.task.cancel(reason)

    def _finished(self, proc: Process) -> None:
        proc.finished_at = time.time()
        self.engine.mcp.detach_relay(proc.id)
        self.scratch.refresh(proc.user)  # what it wrote counts at the user's next launch
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
                    proc.pending_bytes -= event_bytes(value)
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


_MESSAGE_OVERHEAD = 64  # bytes a queued item costs beyond its data, so empty messages are not free


def event_bytes(value: Any) -> int:
    """What an event's value counts against ``event_bytes``: its size plus a fixed overhead."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value) + _MESSAGE_OVERHEAD
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")) + _MESSAGE_OVERHEAD
    return len(repr(value)) + _MESSAGE_OVERHEAD


class InboxBytes:
    """Bytes queued for one process by its client (messages and files together)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class MeteredQueue(asyncio.Queue):  # type: ignore[type-arg]
    """An inbox queue that counts the bytes it holds in a shared :class:`InboxBytes`."""

    def __init__(self, meter: InboxBytes) -> None:
        super().__init__()
        self.meter = meter

    def _put(self, item: Any) -> None:
        self.meter.used += _item_bytes(item)
        super()._put(item)  # type: ignore[misc]

    def _get(self) -> Any:
        item = super()._get()  # type: ignore[misc]
        self.meter.used -= _item_bytes(item)
        return item


def _item_bytes(item: str | bytes) -> int:
    size = len(item.encode("utf-8", "surrogatepass")) if isinstance(item, str) else len(item)
    return size + _MESSAGE_OVERHEAD


def _offer(queue: asyncio.Queue[Any], item: str | bytes, what: str) -> None:
    meter = getattr(queue, "meter", None)
    if isinstance(meter, InboxBytes) and meter.limit and meter.used + _item_bytes(item) > meter.limit:
        raise InvalidInput(f"the process's inbox holds {meter.used} bytes not yet received and this {what} needs "
                           f"{_item_bytes(item)} more, over the {meter.limit}-byte quota (server.quotas.inbox_bytes); "
                           "wait until the inferlet has received what was sent")
    queue.put_nowait(item)
