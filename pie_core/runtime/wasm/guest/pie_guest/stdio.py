"""The guest's ``sys.stdout`` and ``sys.stderr``: text goes to the client as events, through the
host imports ``session.send`` (a Stdout event) and ``session.write_stderr`` (a Stderr event).

They are host calls like any other, so output keeps its order with the inferlet's other calls
(``session.send`` between a flushed partial line and its rest). The rules are the other
runners' (:mod:`pie_core.runtime.stdio`, :mod:`pie_core.runtime.process.worker`): stdout is
line-buffered, one event per complete line, a partial line on ``flush()`` and when ``main``
ends; stderr sends each write; an event carries at most :data:`CHUNK` characters, and a line
that grows past it goes out in pieces of that size, so the buffer stays under it.

WASI's own streams cannot do this: the sandbox's ``sys.stdout`` is a ``TextIOWrapper`` straight
over an unbuffered ``FileIO``, wasmtime takes at most 8192 bytes a write and the wrapper drops
the rest of a short write; a ``flush()`` of a partial line looks like any other write to the
host; and wasmtime hands the bytes to the host from threads of its own, after the guest moved
on. Raw writes to fds 1 and 2 (``os.write``) go nowhere, as in a worker process
(:mod:`pie_core.runtime.wasm.host`).
"""

import io
import sys

__all__ = ["CHUNK", "ClientStream", "install"]

CHUNK = 64 * 1024
"""Characters one Stdout or Stderr event carries at most (as in the other runners)."""


class ClientStream(io.TextIOBase):
    """A text stream whose text becomes the client's ``stream`` events; ``send(text)`` sends one."""

    def __init__(self, send, stream):
        super().__init__()
        self._send_one, self._stream, self._buf = send, stream, ""

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._stream == "stderr":
            self._send(text)
            return len(text)
        self._buf += text
        cut = self._buf.rfind("\n") + 1
        if cut or len(self._buf) >= CHUNK:
            cut = cut or len(self._buf)
            line, self._buf = self._buf[:cut], self._buf[cut:]
            self._send(line)
        return len(text)

    def flush(self):
        line, self._buf = self._buf, ""
        self._send(line)

    def _send(self, text):
        for i in range(0, len(text), CHUNK):
            self._send_one(text[i:i + CHUNK])


def install(transport):
    """Replace ``sys.stdout`` and ``sys.stderr`` with streams that send through ``transport``."""
    sys.stdout = ClientStream(lambda text: transport.call(("session", "send"), (text,)), "stdout")
    sys.stderr = ClientStream(lambda text: transport.call(("session", "write_stderr"), (text,)), "stderr")
