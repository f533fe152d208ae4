"""``pie run``: run one inferlet in-process on a freshly started engine."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import threading
from pathlib import Path
from typing import Any

from pie_core.cli.backend_args import add_backend_arguments, engine_options
from pie_core.cli.progress import load_model, wasm_build_notice
from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.errors import InvalidInput, Unsupported
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import equip_for_spawn, run_inferlet
from pie_core.runtime.library import find_inferlet
from pie_core.runtime.manifest import load_manifest, parse_cli_args
from pie_core.runtime.wasm.js_build import is_js_entry

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run an inferlet on a local engine",
        description="Run an inferlet folder (or example name). Inferlet input goes after '--': "
        "pie run text-completion -- --prompt 'Hi' --max-tokens 32",
    )
    p.add_argument("target", help="inferlet folder (with Pie.toml) or the name of an example")
    p.add_argument("--backend", help="backend name (see 'pie backends'); default: engine.default_backend "
                   "(auto: torch if installed, else cpu)")
    p.add_argument("--model", help="a model name (see 'pie model list'), a .gguf file or a Hugging Face folder "
                   "(config.json + *.safetensors), or a Hugging Face repo id in the local cache (owner/name, owner/name:FILE; "
                   "see 'pie model pull'); default: engine.default_model")
    p.add_argument("--dummy", action="store_true", help="use the dummy backend (no weights, random tokens)")
    p.add_argument("--events", choices=["jsonl"], help="print every event as one JSON object per line")
    p.add_argument("--policy", choices=["adaptive", "greedy"], default="adaptive", help="batching policy")
    add_backend_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no loading progress (a bar on a terminal, else a line per phase on stderr)")
    p.add_argument(
        "--file", action="append", default=[], metavar="PATH", help="queue a file for session.receive_file() (repeatable)"
    )
    p.add_argument("--output-dir", default="pie-output", help="where files the inferlet sends are written")
    p.add_argument("--isolation", choices=["inprocess", "wasm"], default="inprocess",
                   help="inprocess (default): the inferlet runs in this process; wasm: in the WebAssembly sandbox "
                   "'pie serve' uses (pip install 'pie-engine[wasm]')")
    p.add_argument("--server", metavar="URL", help="run on a 'pie serve' server (ws://host:port) instead of locally")
    p.add_argument("--token", help="token for --server (default: $PIE_TOKEN)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.server:
        from pie_core.client.remote_run import run_remote

        saver = _FileSaver(Path(args.output_dir), Path(args.target).name)
        printer = _JsonlPrinter(saver) if args.events == "jsonl" else _TextPrinter(saver)
        files = [_read_file(f) for f in args.file]
        final = run_remote(args.server, args.target, args.trailing, files, printer, args.token)
        return 0 if final.kind == "return" else 1
    options = engine_options(args)  # bad flags or config fail before anything loads
    manifest = load_manifest(find_inferlet(args.target))
    if is_js_entry(manifest.entry):  # a JS/TS inferlet runs only in the sandbox
        args.isolation = "wasm"
    if args.isolation == "wasm":
        from pie_core.runtime.wasm.launcher import wasm_missing

        if missing := wasm_missing(manifest):
            raise Unsupported(missing)
    given = parse_cli_args(args.trailing, manifest)
    manifest.validate_input(given)  # fail on bad parameters before loading anything
    files = [_read_file(f) for f in args.file]
    engine = Engine(options.backend_name, policy=args.policy, **options.engine_kwargs())
    load_model(engine, args.model, quiet=args.quiet)
    saver = _FileSaver(Path(args.output_dir), manifest.name)
    printer = _JsonlPrinter(saver) if args.events == "jsonl" else _TextPrinter(saver)
    final = asyncio.run(_main(engine, manifest, given, printer, files, args.isolation, args.quiet))
    return 0 if final.kind == "return" else 1


def _read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidInput(f"--file {path}: {exc.strerror}") from None


async def _main(engine: Engine, manifest: Any, given: dict[str, Any], printer: Any, files: list[bytes],
                isolation: str = "inprocess", quiet: bool = False) -> Event:
    inst = equip_for_spawn(HostInstance(engine=engine, emit=printer))  # spawn finds folders and examples by name
    for data in files:
        inst.files.put_nowait(data)
    _feed_stdin(inst, asyncio.get_running_loop())
    try:
        if isolation == "wasm":
            from pie_core.runtime.wasm.launcher import run_wasm

            return await run_wasm(engine, manifest, given, inst, on_build=wasm_build_notice(quiet))
        return await run_inferlet(engine, manifest, given, printer, instance=inst)
    finally:
        await engine.close()


def _feed_stdin(inst: HostInstance, loop: asyncio.AbstractEventLoop) -> None:
    """Lines typed on stdin arrive through ``session.receive()`` (a daemon thread reads them)."""

    def pump() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(inst.inbox.put_nowait, line.rstrip("\n"))

    if sys.stdin is not None and not sys.stdin.closed:
        threading.Thread(target=pump, name="pie-stdin", daemon=True).start()


class _FileSaver:
    """Writes each File event to ``<dir>/<inferlet>-<n>.bin`` and returns the path."""

    def __init__(self, folder: Path, name: str) -> None:
        self._folder, self._name, self._count = folder, name, 0

    def __call__(self, data: bytes) -> Path:
        self._folder.mkdir(parents=True, exist_ok=True)
        self._count += 1
        path = self._folder / f"{self._name}-{self._count}.bin"
        path.write_bytes(data)
        return path


class _TextPrinter:
    """Streams Stdout to stdout verbatim, Stderr to stderr, the return value last."""

    def __init__(self, save_file: _FileSaver) -> None:
        self._line_open = False
        self._save = save_file

    def __call__(self, event: Event) -> None:
        if event.kind == "stdout":
            sys.stdout.write(event.value)
            sys.stdout.flush()
            self._line_open = not event.value.endswith("\n")
        elif event.kind == "stderr":
            sys.stderr.write(event.value)
            sys.stderr.flush()
        elif event.kind == "file":
            print(f"[file: {self._save(event.value)} ({len(event.value)} bytes)]", file=sys.stderr)
        elif event.kind == "return":
            if self._line_open:
                sys.stdout.write("\n")
            if event.value is not None:
                value = event.value if isinstance(event.value, str) else json.dumps(event.value)
                print(value)
            sys.stdout.flush()
        elif event.kind == "error":
            if self._line_open:
                sys.stdout.write("\n")
                sys.stdout.flush()
            print(f"error: {event.value}", file=sys.stderr)


class _JsonlPrinter:
    """One JSON object per event: ``{"event": kind, "value": ...}`` (files as base64, plus the
    ``path`` they were saved to)."""

    def __init__(self, save_file: _FileSaver) -> None:
        self._save = save_file

    def __call__(self, event: Event) -> None:
        record: dict[str, Any] = {"event": event.kind, "value": event.value}
        if event.kind == "file":
            record["value"] = base64.b64encode(event.value).decode()
            record["path"] = str(self._save(event.value))
        print(json.dumps(record), flush=True)
