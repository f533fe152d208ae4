"""One attacker per class of issue 13, for ``server_load.py --hostile``.

Each attacker is a loop that runs as user ``mallory`` against a real ``pie serve`` until told
to stop, counting its attempts and its *breaches*: an attempt that got something it must not
(an upload stored with a link in it, another user's program, a reply to a frame that should have
been refused, ...). A refused attempt (an error answer, a killed worker, a closed connection) is
the expected outcome and is not a breach. The honest clients of the benchmark run beside them;
the attackers' only job is to make that hard.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import msgpack
from websockets.asyncio.client import connect as ws_connect

from pie_core.client import ServerError, connect

__all__ = ["AttackContext", "ATTACKERS", "run_attackers"]


@dataclass
class AttackContext:
    url: str  # ws://127.0.0.1:PORT
    http: str  # http://127.0.0.1:PORT
    token: str  # mallory's
    victim_program: str  # a program the honest user uploaded: name@version
    victim_sha256: str  # the sha256 of its archive
    workdir: Path
    stop: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class AttackStats:
    name: str
    attempts: int = 0
    breaches: int = 0
    samples: list[str] = field(default_factory=list)

    def breach(self, what: str) -> None:
        self.breaches += 1
        if len(self.samples) < 3:
            self.samples.append(what)


Attacker = Callable[[AttackContext, AttackStats], Awaitable[None]]


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


_MANIFEST = b'[package]\nname = "evil"\nversion = "1.0.0"\ndescription = "attack"\n'


def hostile_archives() -> list[bytes]:
    """Archives that must all be refused: a symlink chain out, a hard link, ``..`` and absolute
    names, a device, and a gzip bomb."""
    chain = [_link(f"{'d' * 200}{i}", "." if i else "..") for i in range(3)]
    bomb = _tar([_file("Pie.toml", _MANIFEST), _file("main.py", b"\0" * (256 * 2**20))], gz=True)
    dev = tarfile.TarInfo("null")
    dev.type = tarfile.CHRTYPE
    return [
        _tar([_file("Pie.toml", _MANIFEST), *chain, _link("esc", "/".join(f"{'d' * 200}{i}" for i in range(3))),
              _file("esc/config.toml", b"pwned")]),
        _tar([_file("Pie.toml", _MANIFEST), _link("h", "/etc/passwd", tarfile.LNKTYPE)]),
        _tar([_file("Pie.toml", _MANIFEST), _file("../../escape.txt", b"x")]),
        _tar([_file("Pie.toml", _MANIFEST), _file("/tmp/pie-abs-escape.txt", b"x")]),
        _tar([_file("Pie.toml", _MANIFEST), (dev, None)]),
        bomb,
    ]


async def _upload(client: Any, data: bytes) -> Any:
    begin = await client.request("upload_begin", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    if begin["stored"]:
        return begin
    await client.request("upload_chunk", upload=begin["upload"], data=data)
    return await client.request("upload_end", upload=begin["upload"])


async def upload_escape(ctx: AttackContext, st: AttackStats) -> None:
    """Class 1: hostile archives, over and over."""
    archives = await asyncio.to_thread(hostile_archives)
    async with await connect(ctx.url, ctx.token) as client:
        while not ctx.stop.is_set():
            for data in archives:
                st.attempts += 1
                try:
                    got = await _upload(client, data)
                    st.breach(f"hostile archive accepted: {got}")
                except ServerError:
                    pass


async def cross_user(ctx: AttackContext, st: AttackStats) -> None:
    """Class 2: claim the victim's upload by its hash, launch it by name, spawn it by path."""
    async with await connect(ctx.url, ctx.token) as client:
        while not ctx.stop.is_set():
            st.attempts += 1
            begin = await client.request("upload_begin", size=1000, sha256=ctx.victim_sha256)
            if begin["stored"]:
                st.breach("upload_begin answered stored for another user's archive")
            elif begin.get("upload"):
                try:  # more than declared: the server drops it
                    await client.request("upload_chunk", upload=begin["upload"], data=b"x" * 1001)
                except ServerError:
                    pass
            st.attempts += 1
            try:
                await client.launch(ctx.victim_program, {})
                st.breach(f"launched the victim's {ctx.victim_program}")
            except ServerError:
                pass
            await asyncio.sleep(0.05)


_WIRE = '''
import os, stat
async def main(input):
    junk = [b"\\xff\\xff\\xff\\xf0" + b"\\xdd" * 64,
            (40).to_bytes(4, "big") + bytes([0xdd, 0x7f, 0xff, 0xff, 0xff]) + b"\\x91" * 35]
    pipes = 0
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, junk[fd % 2])
                pipes += 1
        except OSError:
            pass
    return f"still here after junk on {pipes} pipes" if pipes else "no pipe to write to"
'''

_LIMITS = '''
import os
from inferlet import runtime
async def main(input):
    try:
        if os.fork() == 0:
            os.setsid()
            while True:
                pass
    except OSError:
        pass
    try:
        await runtime.spawn("evil-limits", {})
    except Exception:
        pass
    while True:
        pass
'''

_STARVE = '''
from inferlet import Context, Model, Sampler, runtime, session
async def main(input):
    model = Model.load(runtime.models()[0])
    held = []
    try:
        for i in range(100000):
            ctx = Context(model)
            ctx.fill(f"{i} " * 200)
            await ctx.flush()
            ctx.save(f"hog-{i}")
            held.append(ctx)
    except Exception:
        pass
    for i in range(10000):
        session.send("z" * 65536)
    return len(held)
'''

_LOGS = '''
async def main(input):
    for i in range(200):
        print("\\x1b[2J\\x1b[31m12:00:00 ERROR pie.server: user alice token=leaked\\x1b[0m")
    return "printed"
'''

_SHARED = '''
def main(input):
    value = [1]
    for _ in range(21):
        value = [value, value]  # 2**21 lists once encoded: refused on the pipe, without stalling the server
    return value
'''

_SLEEPER = '''
import time

def main(input):
    time.sleep(1e6)  # a wait no epoch reaches: terminate must still end it and free its thread
'''

_PROGRAMS = {"evil-wire": _WIRE, "evil-limits": _LIMITS, "evil-starve": _STARVE, "evil-logs": _LOGS,
             "evil-shared": _SHARED, "evil-sleeper": _SLEEPER}


async def _install_evil(client: Any, workdir: Path, name: str) -> str:
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pie.toml").write_text(f'[package]\nname = "{name}"\nversion = "1.0.0"\ndescription = "attack"\n')
    (folder / "main.py").write_text(_PROGRAMS[name])
    return await client.install(folder)


def _inferlet_attacker(name: str, *, breach_if: Callable[[str, Any], str | None]) -> Attacker:
    async def attack(ctx: AttackContext, st: AttackStats) -> None:
        async with await connect(ctx.url, ctx.token) as client:
            program = await _install_evil(client, ctx.workdir, name)
            while not ctx.stop.is_set():
                st.attempts += 1
                proc = await client.launch(program, {})
                try:
                    async for ev in proc.events():
                        if ev.kind in ("return", "error") and (why := breach_if(ev.kind, ev.value)):
                            st.breach(why)
                finally:
                    if not ctx.stop.is_set():
                        await asyncio.sleep(0.1)
    return attack


# a worker that wrote junk on its pipe to the server must be killed; a wasm guest has no pipe to write to
wire = _inferlet_attacker("evil-wire", breach_if=lambda k, v: f"worker survived junk on its pipe: {v}"
                          if k == "return" and v != "no pipe to write to" else None)
limits = _inferlet_attacker("evil-limits", breach_if=lambda k, v: f"limits attacker returned {v}" if k == "return" else None)
starve = _inferlet_attacker("evil-starve", breach_if=lambda k, v: None)
logs = _inferlet_attacker("evil-logs", breach_if=lambda k, v: None)
shared_refs = _inferlet_attacker("evil-shared", breach_if=lambda k, v: "a 2**21-list value was accepted" if k == "return" else None)


async def sleeper(ctx: AttackContext, st: AttackStats) -> None:
    """Issue 36, item 3: inferlets parked in a sleep, terminated a second later, over and over."""
    async with await connect(ctx.url, ctx.token) as client:
        program = await _install_evil(client, ctx.workdir, "evil-sleeper")
        while not ctx.stop.is_set():
            st.attempts += 1
            proc = await client.launch(program, {})
            await asyncio.sleep(1.0)
            await proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                st.breach("a terminated sleeping inferlet did not end within 10 s")
            except Exception:  # noqa: BLE001 - the expected end: an error event
                pass


async def _expect(ctx: AttackContext, st: AttackStats, request: bytes, expect: bytes) -> None:
    """Send one raw request; a reply that does not start with ``expect`` is a breach."""
    host, port = ctx.http.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        reply = await asyncio.wait_for(reader.read(200), 10)
        if not reply.startswith(expect):
            st.breach(f"expected {expect!r}, got {reply[:80]!r}")
    finally:
        writer.close()


async def header_edges(ctx: AttackContext, st: AttackStats) -> None:
    """Issue 36, item 6: two Authorization headers (400), a 70 KB header line (431)."""
    two = (f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ctx.token}\r\n"
           f"Authorization: Bearer other\r\n\r\n").encode()
    big = f"GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: {'a' * 70_000}\r\n\r\n".encode()
    while not ctx.stop.is_set():
        for request, expect in ((two, b"HTTP/1.1 400"), (big, b"HTTP/1.1 431")):
            st.attempts += 1
            await _expect(ctx, st, request, expect)
        await asyncio.sleep(0.05)


async def anonymous_flood(ctx: AttackContext, st: AttackStats) -> None:
    """Issue 36, item 5: 300 idle unauthenticated connections held open, to push out others' requests."""
    host, port = ctx.http.removeprefix("http://").split(":")
    while not ctx.stop.is_set():
        writers = []
        for _ in range(300):
            st.attempts += 1
            try:
                _, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                continue
            writers.append(writer)
        await asyncio.sleep(2)
        for writer in writers:
            writer.close()


def _chat(ctx: AttackContext, body: Any) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(ctx.http + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {ctx.token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def grammar_stall(ctx: AttackContext, st: AttackStats) -> None:
    """Issue 36, item 4: tools whose schema takes seconds to become a grammar (each one new, so no
    cache helps), and a 3.6 MB tools body."""
    i = 0
    huge = [{"type": "function", "function": {"name": f"t{k}", "description": "d" * 28_000,
                                               "parameters": {"type": "object"}}} for k in range(128)]
    while not ctx.stop.is_set():
        i += 1
        pattern = f"(a|b|c|d){{1,{2000 + i % 500}}}x"
        tools = [{"type": "function", "function": {"name": "spell", "parameters": {
            "type": "object", "properties": {"w": {"type": "string", "pattern": pattern}}, "required": ["w"]}}}]
        for body in ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": tools,
                      "tool_choice": "required"},
                     {"messages": [{"role": "user", "content": "hi"}], "tools": huge, "tool_choice": "required"}):
            st.attempts += 1
            status, reply = await asyncio.to_thread(_chat, ctx, body)
            if status >= 500:
                st.breach(f"HTTP {status}: {reply[:120]!r}")


async def pipeline_flood(ctx: AttackContext, st: AttackStats) -> None:
    """Class 5: thousands of pipelined requests on one connection, replies read late."""
    async with ws_connect(ctx.url, additional_headers={"Authorization": f"Bearer {ctx.token}"}, max_size=2**24) as ws:
        while not ctx.stop.is_set():
            for i in range(2000):
                await ws.send(msgpack.packb({"type": "list_programs", "id": i}))
                st.attempts += 1
            for _ in range(2000):
                await ws.recv()


async def slowloris(ctx: AttackContext, st: AttackStats) -> None:
    """Class 5: unauthenticated HTTP requests whose bodies never finish."""
    host, port = ctx.http.removeprefix("http://").split(":")
    while not ctx.stop.is_set():
        writers = []
        for _ in range(50):
            st.attempts += 1
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                continue
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{\"a\":")
            writers.append(writer)
        await asyncio.sleep(2)
        for writer in writers:
            writer.close()


_BAD_BODIES: list[Any] = [
    {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": "x"}},
    {"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": []},
    {"messages": [{"role": "user", "content": "hi"}], "n": True},
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
    "[" * 100_000 + "]" * 100_000,
]


async def http_edges(ctx: AttackContext, st: AttackStats) -> None:
    """Class 7: bodies that once got a 500 or were silently accepted."""
    import urllib.error
    import urllib.request

    def post(body: Any) -> tuple[int, bytes]:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        req = urllib.request.Request(ctx.http + "/v1/chat/completions", data=data, method="POST",
                                     headers={"Authorization": f"Bearer {ctx.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    while not ctx.stop.is_set():
        for body in _BAD_BODIES:
            st.attempts += 1
            status, reply = await asyncio.to_thread(post, body)
            try:
                shaped = isinstance(json.loads(reply).get("error"), dict)
            except (ValueError, AttributeError):
                shaped = False
            if status != 400 or not shaped:
                st.breach(f"HTTP {status} for a bad body: {reply[:120]!r}")


ATTACKERS: dict[str, Attacker] = {
    "upload": upload_escape, "cross-user": cross_user, "wire": wire, "limits": limits,
    "starve": starve, "pipeline": pipeline_flood, "slowloris": slowloris, "logs": logs, "http": http_edges,
    "shared-refs": shared_refs, "sleeper": sleeper, "headers": header_edges, "anonymous-flood": anonymous_flood,
    "grammar-stall": grammar_stall,
}


async def run_attackers(ctx: AttackContext, names: list[str] | None = None) -> tuple[list[asyncio.Task[None]], list[AttackStats]]:
    """Start the attackers (all by default) as tasks; set ``ctx.stop`` and await the tasks to end them."""
    stats = [AttackStats(n) for n in (names or list(ATTACKERS))]

    async def guarded(attacker: Attacker, st: AttackStats) -> None:
        started = time.monotonic()
        while not ctx.stop.is_set():
            try:
                await attacker(ctx, st)
            except Exception as exc:  # a refused connection or a killed stream is the server defending itself
                if len(st.samples) < 3 and time.monotonic() - started < 1:
                    st.samples.append(f"attacker error: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.2)

    tasks = [asyncio.get_running_loop().create_task(guarded(ATTACKERS[s.name], s), name=f"attack-{s.name}") for s in stats]
    return tasks, stats


async def _main(spec: dict[str, Any]) -> list[dict[str, Any]]:
    ctx = AttackContext(spec["url"], spec["http"], spec["token"], spec["victim_program"], spec["victim_sha256"],
                        Path(tempfile.mkdtemp(prefix="pie-attack-")))
    tasks, stats = await run_attackers(ctx, spec.get("attackers"))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # the benchmark closes our stdin to stop us
    ctx.stop.set()
    await asyncio.wait(tasks, timeout=20)
    for task in tasks:
        task.cancel()
    return [{"name": st.name, "attempts": st.attempts, "breaches": st.breaches, "samples": st.samples} for st in stats]


def main() -> None:
    """``python attackers.py SPEC_JSON``: attack until stdin closes, then print the stats as JSON.
    The attackers run in their own process so that their client-side work does not slow the
    benchmark's honest clients, only the server."""
    print(json.dumps(asyncio.run(_main(json.loads(sys.argv[1])))), flush=True)


if __name__ == "__main__":
    main()
