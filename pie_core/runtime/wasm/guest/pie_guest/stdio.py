"""The guest's ``sys.stdout`` and ``sys.stderr``: text goes to the client as events, through the
host imports ``session.send`` (a Stdout event) and ``session.write_stderr`` (a Stderr event).

They are host calls like any other, so output keeps its order with the inferlet's other calls
(``session.send`` between a flushed partial line and its rest). The rules are the other
runners' (:class:`inferlet.host.entry.ClientStream`, which the worker uses too): stdout is
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

import sys

from inferlet.host.entry import CHUNK, ClientStream

__all__ = ["CHUNK", "ClientStream", "install"]


def install(transport):
    """Replace ``sys.stdout`` and ``sys.stderr`` with streams that send through ``transport``."""
    sys.stdout = ClientStream(lambda text: transport.call(("session", "send"), (text,)), "stdout")
    sys.stderr = ClientStream(lambda text: transport.call(("session", "write_stderr"), (text,)), "stderr")
