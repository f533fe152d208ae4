"""``pie serve``: run the engine behind a WebSocket + HTTP server (docs/server.md)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import logging
import socket
from pathlib import Path
from typing import Any

from rich.console import Console

from pie_core.cli.backend_args import add_backend_arguments, engine_options
from pie_core.cli.progress import load_model, wasm_build_notice
from pie_core.errors import InvalidInput, Unsupported

__all__ = ["register", "is_loopback"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve inferlets to clients over WebSocket, plus OpenAI-compatible HTTP",
        description="Serve an engine: WebSocket protocol for the Pie client SDK, and /v1/chat/completions, "
        "/v1/completions, /v1/models, /health and /metrics over HTTP on the same port.",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default: 8080; 0 picks a free one)")
    p.add_argument("--backend", help="backend name (see 'pie backends'); default: engine.default_backend "
                   "(auto: torch if installed, else cpu)")
    p.add_argument("--model", help="a model name (see 'pie model list'), a .gguf file or a Hugging Face folder "
                   "(config.json + *.safetensors), or a Hugging Face repo id in the local cache (owner/name, owner/name:FILE; "
                   "see 'pie model pull'); default: engine.default_model")
    p.add_argument("--dummy", action="store_true", help="use the dummy backend (no weights, random tokens)")
    p.add_argument("--no-auth", action="store_true", help="let every client in as user 'local' (loopback hosts only)")
    p.add_argument("--data-dir", type=Path, help="where uploaded programs are stored (default: ~/.pie/server)")
    p.add_argument("--status-interval", type=float, default=10.0, help="seconds between status lines (0: none)")
    p.add_argument("--policy", choices=["adaptive", "greedy"], default="adaptive", help="batching policy")
    add_backend_arguments(p)
    p.add_argument("--replicas", metavar="N",
                   help="serve each model from N replicas (data parallel), each a backend instance with its own "
                   "KV pool and batcher; requests go to the replica with room, their cached prompt prefix, "
                   "and the least load (default: engine.replicas, or 1)")
    p.add_argument("--ray", action="store_true",
                   help="run each replica's backend in a Ray actor, in its own process, on any machine of a Ray "
                   "cluster (RAY_ADDRESS, else a Ray started here); placement and KV pages stay in this engine "
                   "(default: engine.ray; needs pip install 'pie-engine[ray]')")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="the Ray cluster for --ray, e.g. auto, head:6379 or ray://head:10001 (implies --ray)")
    p.add_argument("--isolation", choices=["auto", "wasm", "process", "inprocess"], default="auto",
                   help="wasm: each inferlet in a WebAssembly sandbox (no files but its scratch directory, no "
                   "sockets, no processes); process: each in its own worker process; inprocess: a task in the "
                   "server (no containment). Limits come from config. Default auto: wasm when its toolchain "
                   "is installed (pip install 'pie-engine[wasm]'), else process")
    p.set_defaults(handler=_serve)


def _replicas_note(engine: Any) -> str:
    """`` × N replicas`` when the engine serves each model from several, else nothing."""
    n = int(getattr(engine, "num_replicas", 1))
    on_ray = " on Ray" if getattr(engine, "ray", None) is not None else ""
    return f" × {n} replicas{on_ray}" if n > 1 else on_ray


def _isolation(choice: str) -> str:
    """The runner ``--isolation`` names: ``auto`` is wasm where its toolchain is installed.

    Raises:
        Unsupported: ``wasm`` was asked for and cannot run here (the message says what to install).
    """
    from pie_core.runtime.wasm.build import toolchain_missing

    missing = toolchain_missing()
    if choice == "auto":
        return "process" if missing else "wasm"
    if choice == "wasm" and missing:
        raise Unsupported(missing)
    return choice


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port_in_use(host: str, port: int) -> InvalidInput:
    return InvalidInput(f"port {port} on {host} is in use (another pie serve?): pick another with --port "
                        "(--port 0 picks a free one)")


def _refuse_busy_port(host: str, port: int) -> None:
    """Fail before the model loads when ``host:port`` is taken (the server's own bind still
    decides: the port may be taken in between).

    Raises:
        InvalidInput: Another socket listens on the port.
    """
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return  # a host that does not resolve: the server's bind reports it
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise _port_in_use(host, port) from None


def _url_host(host: str) -> str:
    """The host a browser on this machine opens (a wildcard bind answers on loopback too)."""
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _serve(args: argparse.Namespace) -> int:
    from pie_core.engine.engine import Engine
    from pie_core.server import Authenticator, PieServer, ServerOptions

    if args.no_auth and not is_loopback(args.host):
        raise InvalidInput(
            f"refusing --no-auth on {args.host}: anyone who reaches that address could run code on this machine. "
            "Bind a loopback host (--host 127.0.0.1) or keep auth on and add users with 'pie auth add NAME'."
        )
    auth = Authenticator.from_config(enabled=not args.no_auth)
    if auth.enabled and auth.user_count == 0:
        raise InvalidInput("auth is on but no users exist: add one with 'pie auth add NAME' (or use --no-auth on a loopback host)")
    from pie_core.server.cors import CorsPolicy
    from pie_core.server.quotas import Quotas

    quotas = Quotas.from_config()  # a bad [server.quotas] table stops us before the model loads
    cors = CorsPolicy.from_config()  # and a bad [server] cors_origins
    engine_opts = engine_options(args)  # so do bad pool flags or [engine] keys
    args.isolation = _isolation(args.isolation)  # and a runner that cannot run here
    console = Console(stderr=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    engine = Engine(engine_opts.backend_name, policy=args.policy, **engine_opts.engine_kwargs())
    _refuse_busy_port(args.host, args.port)  # a port another server holds stops us before the model loads too
    load_model(engine, args.model)
    options = ServerOptions(host=args.host, port=args.port, data_dir=args.data_dir, status_interval=args.status_interval,
                            quotas=quotas, cors=cors)
    from pie_core.runtime.process import ProcessLauncher, WorkerLimits
    from pie_core.runtime.launcher import InProcessLauncher

    limits = WorkerLimits.from_config()
    if args.isolation == "wasm":
        from pie_core.runtime.wasm.host import GuestLimits
        from pie_core.runtime.wasm.launcher import WasmLauncher

        launcher: Any = WasmLauncher(GuestLimits(wall_s=limits.wall_s, memory_mb=limits.memory_mb),
                                     on_build=wasm_build_notice())
    else:
        from pie_core.runtime.wasm.host import GuestLimits
        from pie_core.runtime.wasm.launcher import JsInWasm

        inner = ProcessLauncher(limits) if args.isolation == "process" else InProcessLauncher()
        # JS/TS inferlets run only in the wasm sandbox, under the same limits
        launcher = JsInWasm(inner, GuestLimits(wall_s=limits.wall_s, memory_mb=limits.memory_mb),
                            on_build=wasm_build_notice())
    server = PieServer(engine, options, auth=auth, console=console, launcher=launcher)

    async def run() -> None:
        try:
            await server.start()
        except OSError as exc:
            await server.close()  # the engine's threads stop too
            if exc.errno == errno.EADDRINUSE:  # taken since _refuse_busy_port looked
                raise _port_in_use(args.host, args.port) from None
            raise InvalidInput(f"cannot listen on port {args.port} on {args.host}: {exc.strerror or exc}; "
                               "pick another --host or --port") from None
        if isinstance(launcher, ProcessLauncher):
            launcher.warm_up()  # the zygote imports Pie while the server waits for its first client
        elif args.isolation == "wasm":
            await launcher.host()  # build (first time only) and compile the component before taking clients
        mode = "auth off (user 'local')" if not auth.enabled else f"auth on (users: {auth.user_count})"
        console.print(f"pie serve on [bold]{server.url}[/] (http://{args.host}:{server.port}/v1) · "
                    f"{', '.join(engine.models)} on {engine.backend}{_replicas_note(engine)} · {mode} · "
                    f"isolation {args.isolation}", soft_wrap=True)
        page = f"http://{_url_host(args.host)}:{server.port}/"
        console.print(f"chat in a browser: [bold]{page}[/]" + (" (paste a token from 'pie auth add NAME')" if auth.enabled else ""),
                      soft_wrap=True)
        await server.serve_until_signalled()
        console.print("pie serve stopped")

    asyncio.run(run())
    return 0
