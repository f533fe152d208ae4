"""The zygote: a process that imports Pie and the SDK once, then forks a fresh worker per launch.

Started by :class:`pie_core.runtime.process.spawner.Zygote` as
``python -P -c "from pie_core.runtime.process.zygote import main; main()"`` in its own session,
from a fresh interpreter (it shares nothing with the server but the environment it was given).

Its stdin is a ``SOCK_SEQPACKET`` Unix socket: each request is the message ``fork <id>`` with
two file descriptors attached (the worker's stdin and stdout pipe ends). Its stdout carries
lines: ``ready`` once the imports are done, ``pid <id> <pid>`` (or ``pid <id> -1 <why>``) per
request, and ``exit <pid> <code>`` when a worker ends (``code`` as ``Popen.returncode``:
negative for a signal). EOF on stdin ends the zygote; running workers live on until their own
pipes close.

A forked worker first starts its own session (so the server can kill its whole process group),
drops every descriptor of the zygote, and only then runs :func:`worker.main`.
"""

from __future__ import annotations

import gc
import os
import selectors
import signal
import socket
import sys
import traceback
from dataclasses import dataclass

from pie_core.runtime.process import seccomp

__all__ = ["main"]


@dataclass(frozen=True, slots=True)
class _Own:
    """The zygote's own descriptors, which a forked worker must drop."""

    ctl: socket.socket
    sel: selectors.BaseSelector
    wake_r: int
    wake_w: int


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # unbuffered: a forked child never re-flushes it


def main() -> None:
    from pie_core.runtime.process.worker import preload

    preload()
    if not seccomp.available():
        print("pie zygote: this kernel has no seccomp filter; processes an inferlet starts are not contained "
              "(they may outlive the worker's kill and get memory limits of their own)", file=sys.stderr, flush=True)
    gc.freeze()  # the preloaded objects stay out of every later collection: fewer copy-on-write pages
    ctl = socket.socket(fileno=0)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd makes select() return
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    own = _Own(ctl, sel, wake_r, wake_w)
    _say("ready")
    while True:
        for key, _ in sel.select():
            if key.fileobj is ctl:
                msg, fds, _, _ = socket.recv_fds(ctl, 256, 2)
                if not msg:  # the server closed its end: nothing more to fork
                    os._exit(0)
                _serve_request(msg.decode(), fds, own)
            else:
                _drain(wake_r)
                _reap()


def _serve_request(msg: str, fds: list[int], own: _Own) -> None:
    verb, _, rid = msg.partition(" ")
    if verb != "fork" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        _say(f"pid {rid or 0} -1 bad request {msg!r} with {len(fds)} descriptors")
        return
    try:
        pid = _fork(fds[0], fds[1], own)
    except OSError as exc:
        _say(f"pid {rid} -1 {exc}")
        return
    _say(f"pid {rid} {pid}")


def _fork(rfd: int, wfd: int, own: _Own) -> int:
    sync_r, sync_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (sync_r, sync_w, rfd, wfd):
            os.close(fd)
        raise
    if pid == 0:
        try:
            _become_worker(rfd, wfd, sync_r, sync_w, own)
        except BaseException:
            traceback.print_exc()
        os._exit(70)
    for fd in (sync_w, rfd, wfd):
        os.close(fd)
    os.read(sync_r, 1)  # returns once the child leads its own session (or has died)
    os.close(sync_r)
    return pid


def _become_worker(rfd: int, wfd: int, sync_r: int, sync_w: int, own: _Own) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    own.sel.close()
    for fd in (own.wake_r, own.wake_w, sync_r):
        os.close(fd)
    own.ctl.detach()  # fd 0 is replaced below; the socket object must not close it
    os.setsid()
    os.write(sync_w, b"s")
    os.close(sync_w)
    os.dup2(rfd, 0)
    os.dup2(wfd, 1)
    os.close(rfd)
    os.close(wfd)
    if "numpy.random" in sys.modules:  # ``random`` reseeds itself after fork; numpy's global state does not
        sys.modules["numpy.random"].seed()
    from pie_core.runtime.process.worker import main as worker_main

    worker_main()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")
