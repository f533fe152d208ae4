"""Class 5, shutdown: SIGTERM ends ``pie serve`` within 5 s whatever its clients do."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import msgpack
from hostile import PROBE
from websockets.asyncio.client import connect as ws_connect

from pie_core.client import connect
from pie_core.server.auth import add_user


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_serving(proc: subprocess.Popen[bytes], log: list[str], within_s: float = 600.0) -> None:
    """Wait for the "pie serve on" line: the port listens earlier, while a first run still builds
    the wasm component, and the SIGTERM handler is installed once serving starts."""
    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            log.append(raw.decode(errors="replace"))
            if "pie serve on" in log[-1]:
                ready.set()

    ready = threading.Event()
    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + within_s
    while not ready.wait(0.2):
        assert proc.poll() is None, "pie serve exited:\n" + "".join(log)
        assert time.monotonic() < deadline, "pie serve did not start serving:\n" + "".join(log)


def test_sigterm_ends_pie_serve_within_5_s_despite_stalled_and_unreading_clients(tmp_path, monkeypatch):
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    token = add_user("alice")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pie_core.cli.main", "serve", "--dummy", "--port", str(port),
                             "--status-interval", "0", "--data-dir", str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PIE_HOME": str(tmp_path)})
    held: list[socket.socket] = []
    try:
        log: list[str] = []
        _wait_until_serving(proc, log)
        url = f"ws://127.0.0.1:{port}"

        async def hold_clients() -> None:
            async with await connect(url, token) as alice:
                program = await alice.install(PROBE)
            # a WebSocket client that never reads while its process streams to it
            ws = await ws_connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_queue=1)
            await ws.send(msgpack.packb({"type": "launch", "id": 1, "program": program,
                                         "input": {"mode": "generate", "max_tokens": 100_000}}))
            await asyncio.sleep(1.0)  # the server's send buffer to it fills up
            held.append(ws.transport.get_extra_info("socket").dup())  # stays open, unread, after this loop ends

        asyncio.run(hold_clients())
        body_head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Length: 100000\r\n\r\n{\"messages\": ").encode()
        for data, half_close in ((body_head, True), (body_head, False),
                                 (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 9\r\n\r\n{", False),
                                 (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n", False)):  # unfinished handshake
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            held.append(sock)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            raise AssertionError("pie serve was still running 5 s after SIGTERM") from None
        time.sleep(0.2)  # the reader thread takes the last lines
        assert proc.returncode == 0, "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for sock in held:
            sock.close()
