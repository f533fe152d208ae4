"""Class 5, shutdown: SIGTERM ends ``pie serve`` within 5 s whatever its clients do."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
from hostile import PROBE
from websockets.asyncio.client import connect as ws_connect

from pie_core.client import connect
from pie_core.server.auth import add_user


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(proc: subprocess.Popen[bytes], port: int, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "pie serve exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("pie serve did not start listening")


def test_sigterm_ends_pie_serve_within_5_s_despite_stalled_and_unreading_clients(tmp_path, monkeypatch):
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    token = add_user("alice")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pie_core.cli.main", "serve", "--dummy", "--port", str(port),
                             "--status-interval", "0", "--data-dir", str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PIE_HOME": str(tmp_path)})
    held: list[socket.socket] = []
    try:
        _wait_for_port(proc, port)
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
        assert proc.returncode == 0, proc.stdout.read().decode() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for sock in held:
            sock.close()
