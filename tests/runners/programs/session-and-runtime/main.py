"""The session with the client and the runtime's facts: Stdout events from session.send (text
and JSON) and print, a File event from send_file, messages and a file the client sent
(receive/receive_file), a Stderr line, runtime.username/version/instance_id, and a file written
and read back in the user's scratch directory."""

import json
import os
import sys

from inferlet import runtime, session


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def main(input):
    out = {}
    session.send("plain text")
    session.send({"json": [1, 2, 3]})
    session.send_file(b"\x00\x01binary\xff")
    print("printed line")
    print("to stderr", file=sys.stderr)
    first = await session.receive()
    second = await session.receive()
    data = await session.receive_file()
    session.send(f"got {first!r} and {second!r}")
    session.send_file(data[::-1])
    out["received"] = [first, second, len(data)]

    out["username"] = runtime.username()
    out["version"] = runtime.version()
    out["instance_id_type"] = type(runtime.instance_id()).__name__
    check(runtime.instance_id(), "instance_id is not empty")
    scratch = runtime.scratch_dir()
    path = runtime.scratch_path("runners-suite/notes/today.json")
    check(path.startswith(scratch.rstrip("/") + "/"), f"{path} lies in {scratch}")
    with open(path, "w") as f:
        json.dump({"note": "buy milk"}, f)
    with open(path) as f:
        out["scratch_roundtrip"] = json.load(f)
    out["listed"] = sorted(os.listdir(os.path.dirname(path)))
    os.remove(path)
    out["removed"] = os.path.exists(path)
    for bad in ("../escape", "/etc/passwd", ""):
        try:
            runtime.scratch_path(bad)
            out.setdefault("refused", []).append(None)
        except Exception as exc:  # noqa: BLE001
            out.setdefault("refused", []).append([type(exc).__name__, str(exc)])
    return out
