"""Worker process entry: runs one inferlet with ``pie_core.host`` calls forwarded to the engine.

Forked from the zygote (:mod:`pie_core.runtime.process.zygote`), or started on its own as
``python -P -c "from pie_core.runtime.process.worker import main; main()"``; fd 0 carries
engine frames and the original fd 1 worker frames (:mod:`.wire`). Once the worker has started,
fds 1 and 2 point at ``/dev/null``: nothing the inferlet writes to them (``os.write``, C
extensions) reaches the server's log. ``print()``/``sys.stdout`` become the client's Stdout
events, one per line (a partial line goes out on ``flush()`` and when ``main`` ends), and
``sys.stderr`` its Stderr events, one per write.

The SDK's host transport here is the pipe (:class:`WireTransport`): each host call is sent to the
engine, which runs it for this worker's instance and sends back the result. Engine objects come
back as opaque handles, good only as arguments of host functions.

The worker runs one inferlet, so the inferlet may block: the transport lets the SDK's
synchronous forms run their waits on private event loops of this process, and a plain ``def
main(input)`` runs as synchronous code, in which the SDK's waiting calls return values.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import select
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from inferlet.host.entry import MAIN_EXITS, exit_outcome
from inferlet.host import entry
from pie_core.runtime import host_api
from pie_core.runtime.host_api import HOST_MODULES
from pie_core.runtime.process import sandbox
from pie_core.runtime.process.wire import HEADER, Codec, ProtocolError, check_frame_size

__all__ = ["main", "preload", "HOST_MODULES", "WireTransport"]



class _Remote:
    """A worker-side stand-in for an engine object: an opaque token that host calls take as an
    argument. It has no members; a copy of it is itself."""

    __slots__ = ("_rid", "_kind")

    def __init__(self, rid: int, kind: host_api.HandleKind) -> None:
        object.__setattr__(self, "_rid", rid)
        object.__setattr__(self, "_kind", kind)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"a {self._kind.name} handle is opaque and has no attribute {name!r}; "
                             "pass it to the inferlet.host functions that take one")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._kind.name} handles are read-only")

    def __repr__(self) -> str:
        return f"<{self._kind.name} handle {self._rid}>"

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


class _Link:
    """The worker's end of the pipe: blocking calls, awaitable calls, one-way notes.

    No reader thread: replies are read by whoever waits for one. An event loop of this process
    reads them when the pipe is readable (:meth:`pump`, registered by :func:`_run` and by the
    private loops of the synchronous forms); a blocking :meth:`call` reads until its own reply
    came. One reader at a time; replies it reads for others settle their waiters (across threads
    where a waiter lives on another). Frames are written whole under a lock; a write made while
    this thread is already writing (a finaliser that prints, run by the garbage collector
    mid-write) goes out after."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self._r, self._w = rfd, wfd
        self._inbox = bytearray()
        self._lock, self._ids = threading.Lock(), itertools.count(1)
        self._writing = threading.local()
        self._later: collections.deque[bytes] = collections.deque()
        self._waiting: dict[int, Callable[[bool, Any], None]] = {}
        self._remotes: dict[int, _Remote] = {}
        self._turn = threading.Condition()
        self._reader: int | None = None  # the thread reading the pipe now
        self.codec = Codec(self._to_ref, self._from_ref)

    @property
    def fd(self) -> int:
        return self._r

    def _to_ref(self, obj: Any) -> tuple[int, str] | None:
        return (obj._rid, obj._kind.name) if type(obj) is _Remote else None

    def _from_ref(self, rid: int, name: str) -> _Remote:
        kind = host_api.handle_kind(name=name)
        if kind is None:
            raise ProtocolError(f"the engine sent a handle of unknown kind {name!r}")
        if rid not in self._remotes:
            self._remotes[rid] = _Remote(rid, kind)
        return self._remotes[rid]

    def read(self) -> Any:
        """The next frame, waiting for it (the first frame, before anything else reads)."""
        while (frame := self._take()) is None:
            self._fill(block=True)
        return self.codec.decode(frame)

    def _fill(self, block: bool) -> bool:
        """Add what the pipe holds to the inbox; False when nothing was there (not blocking)."""
        if block:
            select.select([self._r], [], [])
        try:
            chunk = os.read(self._r, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            os._exit(0)  # the engine went away (or killed us): nothing left to do
        self._inbox += chunk
        return True

    def _take(self) -> bytes | None:
        """Cut the first whole frame's payload off the inbox, or None."""
        inbox = self._inbox
        if len(inbox) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(inbox)
        check_frame_size(size)
        end = HEADER.size + size
        if len(inbox) < end:
            return None
        payload = bytes(inbox[HEADER.size:end])
        del inbox[:end]
        return payload

    def _settle_inbox(self) -> None:
        while (frame := self._take()) is not None:  # each frame is cut off before it settles
            msg = self.codec.decode(frame)
            if not (isinstance(msg, list) and len(msg) == 4 and msg[0] == "reply" and msg[1] in self._waiting):
                raise ProtocolError(f"unexpected message from the engine: {str(msg)[:200]}")
            self._waiting.pop(msg[1])(bool(msg[2]), msg[3])

    def _read_turn(self, block: bool) -> None:
        """Read and settle what arrived as the one reader; with ``block``, wait for data, or
        for the reader of another thread to finish its turn. Any failure ends the worker."""
        me = threading.get_ident()
        nested = self._reader == me  # a finaliser's call made while this thread reads
        if not nested:
            with self._turn:
                if self._reader is not None:
                    if block:
                        self._turn.wait()
                    return
                self._reader = me
        try:
            if self._fill(block):
                self._settle_inbox()
        except BaseException as exc:  # never die silently: the inferlet would wait forever
            self.fail(f"the worker's pipe reader failed: {type(exc).__name__}: {exc}")
        finally:
            if not nested:
                with self._turn:
                    self._reader = None
                    self._turn.notify_all()

    def pump(self) -> None:
        """An event loop's reader callback: settle the replies the pipe holds now."""
        self._read_turn(block=False)

    def send(self, msg: Any) -> None:
        """Write ``msg`` as one frame (TypeError/ValueError if it cannot cross)."""
        data = self.codec.encode(msg)
        if getattr(self._writing, "busy", False):
            self._later.append(data)
            return
        with self._lock:
            self._writing.busy = True
            try:
                self._write(data)
                while self._later:
                    self._write(self._later.popleft())
            finally:
                self._writing.busy = False

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._w, view):]

    def fail(self, why: str) -> None:
        try:
            self.send(["done", "error", why])
        finally:
            os._exit(1)

    def _request(self, op: str, args: tuple[Any, ...], settle: Callable[[bool, Any], None]) -> int:
        """Send call ``op``; whoever reads its reply hands it to ``settle(ok, value)``. Its id."""
        rid = next(self._ids)
        self._waiting[rid] = settle
        try:
            self.send([op, rid, *args])
        except BaseException:
            del self._waiting[rid]
            raise
        return rid

    def call(self, op: str, *args: Any) -> Any:
        box: list[tuple[bool, Any]] = []
        self._request(op, args, lambda ok, value: box.append((ok, value)))
        while not box:
            self._read_turn(block=True)
        ok, value = box[0]
        if not ok:
            raise value
        return value

    async def acall(self, op: str, *args: Any) -> Any:
        # the loop running now: the worker's, or a private one of a blocking wait
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        home = threading.get_ident()

        def resolve(ok: bool, value: Any) -> None:
            if fut.done():
                return
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

        def settle(ok: bool, value: Any) -> None:
            try:
                if threading.get_ident() == home:
                    resolve(ok, value)
                else:
                    loop.call_soon_threadsafe(resolve, ok, value)
            except RuntimeError:  # that loop was closed: nobody waits for the reply any more
                pass

        rid = self._request(op, args, settle)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.done():  # still open in the engine: cancel it there too, and let it end first
                self.send(["cancel", rid])  # (its pages, its spawned children), so what it held is back
                try:
                    await asyncio.wait_for(asyncio.shield(fut), CANCEL_WAIT_S)
                except BaseException:  # noqa: BLE001 - its outcome is the cancellation's
                    pass
            raise

    def new_loop(self) -> asyncio.AbstractEventLoop:
        """An event loop that settles this link's replies as they arrive."""
        loop = asyncio.new_event_loop()
        loop.add_reader(self._r, self.pump)
        return loop


CANCEL_WAIT_S = 10.0
"""How long a cancelled call waits for the engine to end its side before the cancellation goes on."""


class WireTransport:
    """The worker's host transport: every call is a ``call`` frame, answered by a ``reply``."""

    def __init__(self, link: _Link) -> None:
        self._link = link
        self.blocking = link.new_loop  # one inferlet per process: it may block, on a private loop

    def call(self, key: tuple[str, str], args: tuple[Any, ...]) -> Any:
        return self._link.call("call", key[0], key[1], args)

    def call_async(self, key: tuple[str, str], args: tuple[Any, ...]) -> Any:
        return self._link.acall("call", key[0], key[1], args)

    def tell(self, key: tuple[str, str], args: tuple[Any, ...]) -> None:
        self._link.send(["tell", key[0], key[1], args])  # one-way: no reply to wait for


def preload() -> None:
    """Import what every worker needs (the SDK, the host modules, the runner) so that the
    limits and the confinement apply to the inferlet alone; the zygote runs this once."""
    import inferlet  # noqa: F401
    import pie_core.runtime.instance  # noqa: F401

    host_api.host_functions()
    sandbox.loaded_roots()


async def _run(link: _Link) -> None:
    from pie_core.runtime.instance import load_entry
    from pie_core.runtime.manifest import Manifest
    from pie_core.runtime.process.limits import WorkerLimits

    first = link.read()
    manifest = Manifest(name=first["name"], version="", description="", entry=first["entry"], root=Path(first["root"]))
    entry.install(WireTransport(link))
    os.set_blocking(link.fd, False)
    asyncio.get_running_loop().add_reader(link.fd, link.pump)
    sys.stdout, sys.stderr = (entry.ClientStream(lambda text, kind=kind: link.send(["print", kind, text]), kind)
                              for kind in ("stdout", "stderr"))
    try:
        confined = sandbox.enter(manifest.root, first["scratch"], WorkerLimits(**first["limits"]))
        main = entry.as_coroutine_function(load_entry(manifest, synchronous=True, own_process=True))
        link.send(["started", confined])
        final = ["return", entry.check_return(await main(first["input"]))]
    except MemoryError:
        final = ["error", "MemoryError: the inferlet exceeded its memory limit"]
    except Exception as exc:
        final = ["error", entry.describe(exc)]
    except MAIN_EXITS as exc:  # sys.exit() / KeyboardInterrupt: the run's end, as in every runner
        final = list(exit_outcome(exc))
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - a print that cannot go out must not hide main's result
        pass
    link.send(["done", *final])


def main() -> None:
    preload()
    wfd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # raw writes to fds 1 and 2 go nowhere, never into the server's log or the protocol
    os.dup2(null, 2)
    os.close(null)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - until _run routes them to the client
    loop = asyncio.new_event_loop()
    link = _Link(0, wfd)
    try:
        loop.run_until_complete(_run(link))
    except BaseException as exc:  # noqa: BLE001 - the engine must hear why, not see a bare exit
        link.fail(f"the worker failed: {type(exc).__name__}: {exc}")
    os._exit(0)


if __name__ == "__main__":
    main()
