"""Starting worker processes: forked from a pre-started zygote (cheap), or, as the fallback, a
fresh interpreter per launch (pays the Python and Pie imports each time).

Both kinds get the same environment (:func:`worker_env`), lead their own session (the server
kills a worker with ``killpg``) and speak the same pipe protocol (:mod:`.worker`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pie_core

__all__ = ["WorkerProcess", "Zygote", "ZygoteError", "Spawner", "worker_env"]

log = logging.getLogger("pie.server")

_KEEP = {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONHOME", "PYTHONUTF8", "PYTHONIOENCODING",
         "VIRTUAL_ENV", "LD_LIBRARY_PATH"}
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fork-safe, CPU-limited
_WORKER_MAIN = "from pie_core.runtime.process.worker import main; main()"
_ZYGOTE_MAIN = "from pie_core.runtime.process.zygote import main; main()"


def worker_env() -> dict[str, str]:
    """The environment of workers (and the zygote): the server's locale and paths only, never
    its other variables (tokens, keys), with numeric libraries single-threaded."""
    env = {k: v for k, v in os.environ.items() if k in _KEEP or k.startswith("LC_")}
    env.update(_ONE_THREAD)
    src = Path(pie_core.__file__).resolve().parents[1]
    if any(Path(p or os.curdir).resolve() == src for p in sys.path):  # a source checkout; ``-P`` drops the cwd
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    return env


class ZygoteError(RuntimeError):
    """The zygote could not start or fork a worker (the spawner then execs one instead)."""


class WorkerProcess:
    """A running worker as the launcher sees it: its pid (= process group), its pipe streams
    and its exit code (negative: killed by that signal; ``None``: unknown, its zygote died)."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 exit_code: asyncio.Future[Any], close: Callable[[], None]) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self._exit, self._close = exit_code, close
        self.user: str | None = None  # whose inferlet it runs (set by the launcher)
        self.started_at = time.monotonic()
        self.kill_reason: str | None = None  # why the engine killed it, when it did (the instance's error)

    @property
    def running(self) -> bool:
        return not self._exit.done()

    async def wait(self) -> int | None:
        """The exit code, once the worker has ended."""
        return await asyncio.shield(self._exit)

    async def reap(self, grace_s: float = 2.0) -> None:
        """Wait for a killed worker to be reaped. Cancellation meanwhile is held back for up to
        ``grace_s`` seconds (no exit is left to a closed event loop), then re-raised."""
        loop = asyncio.get_running_loop()
        deadline, cancelled = loop.time() + grace_s, None
        while not self._exit.done():
            timeout = None if cancelled is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                break
            try:
                await asyncio.wait([self._exit], timeout=timeout)
            except asyncio.CancelledError as exc:
                cancelled = exc
        if cancelled is not None:
            raise cancelled

    def memory_bytes(self) -> int:
        """The worker's proportional share of resident memory (PSS: its own pages, plus pages
        it shares with the zygote and other workers divided among them); 0 once it ended."""
        try:
            with open(f"/proc/{self.pid}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Pss:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def kill(self, reason: str | None = None) -> None:
        """SIGKILL the worker's process group (no-op once it is known to have ended); ``reason``
        becomes its instance's error."""
        if reason is not None and self.kill_reason is None:
            self.kill_reason = reason
        if self.running or self._exit.result() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Close the engine's ends of the pipes."""
        self._close()


async def exec_worker() -> WorkerProcess:
    """Start a worker as a fresh interpreter in its own session."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-c", _WORKER_MAIN, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        start_new_session=True, env=worker_env())
    assert proc.stdin is not None and proc.stdout is not None
    stdin = proc.stdin

    def close() -> None:
        stdin.close()
        proc._transport.close()  # type: ignore[attr-defined]  # asyncio has no public close

    return WorkerProcess(proc.pid, stdin, proc.stdout, asyncio.get_running_loop().create_task(proc.wait()), close)


class Zygote:
    """A pre-started zygote process (:mod:`.zygote`) and the workers it forked."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if nobody waits
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[tuple[int, asyncio.Future[int | None]]]] = {}
        self._exits: dict[int, asyncio.Future[int | None]] = {}
        self._ids = itertools.count(1)
        self._lost = False

    @property
    def alive(self) -> bool:
        return not self._lost and (self._reader is None or not self._reader.done())

    @property
    def pid(self) -> int | None:
        """The zygote's process id (None until started)."""
        return None if self._proc is None else self._proc.pid

    async def start(self) -> None:
        """Start the zygote process; :attr:`ready` resolves once it has done its imports."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-c", _ZYGOTE_MAIN, stdin=theirs.fileno(), stdout=asyncio.subprocess.PIPE,
                start_new_session=True, env=worker_env())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._reader = self.loop.create_task(self._read(), name="pie-zygote-reader")

    async def fork(self) -> WorkerProcess:
        """A new worker forked from the zygote.

        Raises:
            ZygoteError: The zygote is gone or could not fork.
        """
        await asyncio.shield(self.ready)
        if self._sock is None or not self.alive:
            raise ZygoteError("the zygote has exited")
        to_r, to_w = os.pipe2(os.O_CLOEXEC)  # engine -> worker
        from_r, from_w = os.pipe2(os.O_CLOEXEC)  # worker -> engine
        rid = next(self._ids)
        reply = self._pending[rid] = self.loop.create_future()
        try:
            try:
                socket.send_fds(self._sock, [f"fork {rid}".encode()], [to_r, from_w])
            except OSError as exc:
                self._lost = True
                raise ZygoteError(f"cannot reach the zygote: {exc}") from exc
            finally:
                os.close(to_r)
                os.close(from_w)
            pid, exit_code = await reply  # a cancelled launch leaves a child that exits on EOF
            stdin, stdout, close = await _pipe_streams(to_w, from_r)
        except BaseException:
            self._pending.pop(rid, None)
            for fd in (to_w, from_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            raise
        return WorkerProcess(pid, stdin, stdout, exit_code, close)

    def abandon(self) -> None:
        """Close the control socket: the zygote exits (used when its event loop is gone)."""
        if self._sock is not None:
            self._sock.close()

    async def aclose(self) -> None:
        """Close the control socket (the zygote exits on EOF) and reap the zygote."""
        self.abandon()
        if self._proc is not None:
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
            self._proc._transport.close()  # type: ignore[attr-defined]  # asyncio has no public close
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            while line := await self._proc.stdout.readline():
                self._handle(line.decode().rstrip("\n").split(" ", 3))
        finally:
            code = self._proc.returncode
            err = ZygoteError(f"the zygote exited{'' if code is None else f' with code {code}'}"
                              f"{'' if self.ready.done() else ' before it was ready'}")
            if not self.ready.done():
                self.ready.set_exception(err)
            for reply in self._pending.values():
                if not reply.done():
                    reply.set_exception(err)
            for exit_code in self._exits.values():  # running workers live on; their exit codes are lost
                if not exit_code.done():
                    exit_code.set_result(None)
            self._pending.clear()
            self._exits.clear()
            if self._sock is not None:
                self._sock.close()

    def _handle(self, words: list[str]) -> None:
        if words[0] == "ready" and not self.ready.done():
            self.ready.set_result(None)
        elif words[0] == "pid":
            reply = self._pending.pop(int(words[1]), None)
            pid = int(words[2])
            if pid < 0:
                if reply is not None and not reply.done():
                    reply.set_exception(ZygoteError(f"the zygote could not fork: {' '.join(words[3:])}"))
            elif reply is not None and not reply.done():
                exit_code = self._exits[pid] = self.loop.create_future()
                reply.set_result((pid, exit_code))
        elif words[0] == "exit":
            ended = self._exits.pop(int(words[1]), None)
            if ended is not None and not ended.done():
                ended.set_result(int(words[2]))
        else:
            log.warning("zygote said something unexpected: %r", " ".join(words))


async def _pipe_streams(wfd: int, rfd: int) -> tuple[asyncio.StreamWriter, asyncio.StreamReader, Callable[[], None]]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    rpipe, wpipe = os.fdopen(rfd, "rb", buffering=0), os.fdopen(wfd, "wb", buffering=0)
    try:
        rtrans, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), rpipe)
    except BaseException:
        rpipe.close()
        wpipe.close()
        raise
    try:
        wtrans, wproto = await loop.connect_write_pipe(lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), wpipe)
    except BaseException:
        rtrans.close()
        wpipe.close()
        raise

    def close() -> None:
        wtrans.close()
        rtrans.close()

    return asyncio.StreamWriter(wtrans, wproto, None, loop), reader, close


class Spawner:
    """Hands out workers: forked from a zygote started on first use (restarted if it dies),
    or exec'd when ``zygote`` is off or the zygote never came up."""

    def __init__(self, zygote: bool = True) -> None:
        self.use_zygote = zygote
        self._zygote: Zygote | None = None
        self._starting: asyncio.Task[None] | None = None

    @property
    def zygote(self) -> Zygote | None:
        """The current zygote, if one was started."""
        return self._zygote

    async def start_worker(self) -> WorkerProcess:
        """A new worker, not yet sent its first message."""
        for attempt in (1, 2):  # a zygote that died since the last launch is replaced once
            if not self.use_zygote:
                break
            try:
                return await (await self._ready_zygote()).fork()
            except ZygoteError as exc:
                if attempt == 2 or not self.use_zygote:
                    log.warning("%s; starting this worker as a fresh interpreter", exc)
        return await exec_worker()

    async def aclose(self) -> None:
        """Stop the zygote (workers already forked are not affected)."""
        zygote, starting, self._zygote, self._starting = self._zygote, self._starting, None, None
        if zygote is None:
            return
        if zygote.loop is not asyncio.get_running_loop():
            zygote.abandon()
            return
        if starting is not None:
            await asyncio.gather(starting, return_exceptions=True)
        await zygote.aclose()

    def warm_up(self) -> None:
        """Start the zygote now, in the background, so that the first launch is cheap too."""
        if self.use_zygote:
            self._current()

    def _current(self) -> Zygote:
        loop = asyncio.get_running_loop()
        zygote = self._zygote
        if zygote is not None and (zygote.loop is not loop or not zygote.alive):
            zygote.abandon()
            zygote = self._zygote = None  # a fresh event loop, or it died after working: start another
        if zygote is None:
            zygote = self._zygote = Zygote()
            self._starting = loop.create_task(zygote.start(), name="pie-zygote-start")
            self._starting.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if unawaited
        return zygote

    async def _ready_zygote(self) -> Zygote:
        zygote = self._current()
        assert self._starting is not None
        try:
            await asyncio.shield(self._starting)
            await asyncio.shield(zygote.ready)
        except (OSError, ZygoteError) as exc:
            self.use_zygote = False  # it never came up: do not try again
            raise ZygoteError(f"cannot start the zygote: {exc}") from exc
        return zygote
