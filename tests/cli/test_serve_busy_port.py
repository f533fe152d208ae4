"""``pie serve`` on a port another socket holds is one line saying to pick another ``--port``,
with exit status 1: before the model loads, and the same line from the server's own bind when
the port was taken after that check."""

from __future__ import annotations

import socket
import threading
from typing import Iterator

import pytest

from pie_core.cli import serve as serve_cli
from pie_core.server import PieServer


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture(autouse=True)
def never_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that did bind would wait for a signal: stop and fail instead of hanging."""

    async def serving(self: PieServer) -> None:
        port = self.port
        await self.close()
        raise AssertionError(f"pie serve bound port {port}")

    monkeypatch.setattr(PieServer, "serve_until_signalled", serving)


def _serve(pie, model, port: int):
    return pie("serve", "--dummy", "--no-auth", "--isolation", "inprocess", "--model", str(model), "--port", str(port))


def _backend_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("pie-backend")}


def _in_use(port: int) -> str:
    return f"error: port {port} on 127.0.0.1 is in use (another pie serve?): pick another with --port"


def test_a_busy_port_is_one_line_and_status_1_before_the_model_loads(pie, tiny_model, busy_port):
    r = _serve(pie, tiny_model, busy_port)
    assert r.code == 1 and r.out == ""
    (line,) = r.err.splitlines()  # not even a loading line
    assert line.startswith(_in_use(busy_port)), r.err


def test_a_port_taken_after_the_check_is_the_same_line_from_the_bind(pie, tiny_model, busy_port, monkeypatch):
    monkeypatch.setattr(serve_cli, "_refuse_busy_port", lambda host, port: None)
    before = _backend_threads()  # engines of earlier tests in this process may still run theirs
    r = _serve(pie, tiny_model, busy_port)
    assert r.code == 1 and "Traceback" not in r.err
    lines = r.err.strip().splitlines()
    assert lines[-1].startswith(_in_use(busy_port)) and sum("error:" in line for line in lines) == 1, r.err
    assert not _backend_threads() - before  # the engine was closed


def test_a_free_port_is_not_refused(pie, tiny_model):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    with pytest.raises(AssertionError, match=f"bound port {free}"):
        _serve(pie, tiny_model, free)
