"""Worker process entry: runs one inferlet with ``pie_core.host`` calls forwarded to the engine.

Forked from the zygote (:mod:`pie_core.server.isolation.zygote`), or started on its own as
``python -P -c "from pie_core.server.isolation.worker import main; main()"``; stdin carries engine
messages and the original stdout carries worker messages (``print`` goes to stderr instead). The SDK is
unchanged: every public function of the host modules is replaced by a proxy that sends the call
to the engine, which runs it for this worker's instance and sends back the result.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import io
import itertools
import os
import pickle
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from pie_core.server.isolation import sandbox
from pie_core.server.isolation.wire import HEADER, Ref, frame

__all__ = ["main", "preload", "HOST_MODULES"]

HOST_MODULES = ("context", "grammar", "inference", "mcp", "messaging", "model", "runtime", "session", "tools")


class _Remote:
    """A worker-side stand-in for an engine-side object; attribute use goes to the engine."""

    __slots__ = ("_rid", "_link")

    def __init__(self, rid: int, link: _Link) -> None:
        object.__setattr__(self, "_rid", rid)
        object.__setattr__(self, "_link", link)

    def __reduce__(self) -> Any:
        return (Ref, (self._rid,))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        kind, value = self._link.call("getattr", self, name)
        if kind == "value":
            return value
        if kind == "amethod":
            async def amethod(*args: Any, **kwargs: Any) -> Any:
                return await self._link.acall("mcall", self, name, args, kwargs)
            return amethod
        return lambda *args, **kwargs: self._link.call("mcall", self, name, args, kwargs)

    def __copy__(self) -> Any:
        return self._link.call("copy", self, False)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self._link.call("copy", self, True)


class _Link:
    """The worker's end of the pipe: blocking calls, awaitable calls, one reader thread."""

    def __init__(self, rfd: int, wfd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._r, self._w = os.fdopen(rfd, "rb", buffering=0), os.fdopen(wfd, "wb", buffering=0)
        self._loop, self._lock, self._ids = loop, threading.Lock(), itertools.count(1)
        self._waiting: dict[int, Callable[[bool, Any], None]] = {}
        self._remotes: dict[int, _Remote] = {}

    def read(self) -> Any:
        head = self._read_exact(HEADER.size)
        return self._unpickle(self._read_exact(HEADER.unpack(head)[0]))

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._r.read(n - len(buf))
            if not chunk:
                os._exit(0)  # the engine went away (or killed us): nothing left to do
            buf += chunk
        return bytes(buf)

    def _unpickle(self, data: bytes) -> Any:
        link = self

        class _Unpickler(pickle.Unpickler):
            def persistent_load(self, pid: Any) -> Any:
                return link._remotes.setdefault(pid, _Remote(pid, link))

        return _Unpickler(io.BytesIO(data)).load()

    def send(self, msg: Any) -> None:
        data = frame(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        with self._lock:
            self._w.write(data)

    def serve_replies(self) -> None:
        while True:
            _, rid, ok, value = self.read()
            self._waiting.pop(rid)(ok, value)

    def call(self, op: str, *args: Any) -> Any:
        done, box = threading.Event(), []

        def settle(ok: bool, value: Any) -> None:
            box.append((ok, value))
            done.set()

        rid = next(self._ids)
        self._waiting[rid] = settle
        self.send((op, rid, *args))
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    async def acall(self, op: str, *args: Any) -> Any:
        fut: asyncio.Future[Any] = self._loop.create_future()

        def resolve(ok: bool, value: Any) -> None:  # on the loop
            if fut.done():
                return
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

        def settle(ok: bool, value: Any) -> None:  # on the reader thread
            self._loop.call_soon_threadsafe(resolve, ok, value)

        rid = next(self._ids)
        self._waiting[rid] = settle
        self.send((op, rid, *args))
        return await fut


def _install_proxies(link: _Link) -> None:
    for short in HOST_MODULES:
        mod = importlib.import_module(f"pie_core.host.{short}")
        for name in getattr(mod, "__all__", []):
            fn = getattr(mod, name)
            if not inspect.isfunction(fn):
                continue
            setattr(mod, name, _proxy(link, short, name, inspect.iscoroutinefunction(fn)))


def _proxy(link: _Link, module: str, name: str, is_async: bool) -> Callable[..., Any]:
    if is_async:
        async def aproxy(*args: Any, **kwargs: Any) -> Any:
            return await link.acall("call", module, name, args, kwargs)
        aproxy.__name__ = name
        return aproxy

    def proxy(*args: Any, **kwargs: Any) -> Any:
        return link.call("call", module, name, args, kwargs)
    proxy.__name__ = name
    return proxy


class _StderrToHost(io.TextIOBase):
    def write(self, text: str) -> int:
        from pie_core.host import session

        if text:
            session.write_stderr(text)
        return len(text)


def preload() -> None:
    """Import what every worker needs (the SDK, the host modules, the runner) so that the
    limits and the confinement apply to the inferlet alone; the zygote runs this once."""
    import inferlet  # noqa: F401
    import pie_core.runtime.instance  # noqa: F401

    for short in HOST_MODULES:
        importlib.import_module(f"pie_core.host.{short}")
    sandbox.loaded_roots()


async def _run(link: _Link) -> None:
    from pie_core.runtime.instance import _describe, _jsonable, load_entry

    manifest, payload, limits, scratch = link.read()
    _install_proxies(link)
    threading.Thread(target=link.serve_replies, name="pie-worker-reader", daemon=True).start()
    try:
        confined = sandbox.enter(Path(manifest.root), scratch, limits)
        entry = load_entry(manifest)
        link.send(("started", confined))
        sys.stderr = _StderrToHost()
        final = ("return", _jsonable(await entry(payload)))
    except MemoryError:
        final = ("error", "MemoryError: the inferlet exceeded its memory limit")
    except Exception as exc:
        final = ("error", _describe(exc))
    link.send(("done", 0, *final))


def main() -> None:
    preload()
    wfd = os.dup(1)
    os.dup2(2, 1)  # the inferlet's print() goes to stderr, never into the protocol stream
    sys.stdout = os.fdopen(1, "w", buffering=1)
    loop = asyncio.new_event_loop()
    link = _Link(0, wfd, loop)
    loop.run_until_complete(_run(link))
    os._exit(0)


if __name__ == "__main__":
    main()
