"""`pie serve` under load: many concurrent clients, each running one short generation.

    python benchmarks/server_load.py                               # 100 clients, both isolation modes
    python benchmarks/server_load.py --isolation inprocess --clients 100 --json load.json
    python benchmarks/server_load.py --waves 3 --set server.worker_start_s=0
    python benchmarks/server_load.py --hostile                     # + one attacker per class (issue 13)
    python benchmarks/server_load.py --isolation all --clients 16 --max-tokens 64 --backend-option step_ms=10
                                                                   # the runners side by side (issue 33)

For each isolation mode the script starts ``pie serve --dummy --no-auth --port 0`` as a
subprocess on loopback (with a fresh ``PIE_HOME`` and data dir, so no user config applies;
``--set KEY=VALUE`` puts settings such as ``server.worker_start_s=0`` into that config), then
runs ``--waves`` waves, one after another, of ``--clients`` clients started at once. Each
client opens its own WebSocket connection with ``pie_core.client``, launches the bundled
``text-completion`` example (``max_tokens`` ``--max-tokens``, a distinct prompt per client)
and reads events until ``return``. One client runs alone first (its latency is reported as the
warm-up: the first launch imports the SDK and xgrammar, the first decode builds the tokenizer's
byte table), then the waves are measured. Per client: latency from before connecting to the ``return`` event, and time to its
first ``stdout`` event; reported are p50 / p99 / max (numpy's linear percentiles), errors (any
exception or ``error`` event), the wall time of the wave, and from the server's ``/metrics``
the batches fired, backend seconds and tokens generated meanwhile. After each wave
``/metrics`` must show no KV page in use and ``/health`` no process; at the end the server
gets SIGTERM and must exit 0.

``--hostile`` turns auth on (users ``honest`` and ``mallory``) and runs each mode's waves
twice on the same server: first the honest clients alone (the baseline), then the same waves
with one attacker per class of ``benchmarks/attackers.py`` running beside them as ``mallory``
(hostile uploads, cross-user reach, junk on the worker pipe, fork and spawn escapes, page and
event hogging, pipelined floods, slowloris HTTP, log injection, malformed OpenAI bodies). The run
is clean when no honest client fails, no attacker breaches anything, and the honest p99 with
attackers is at most twice the baseline's.

With ``--isolation all`` (in-process, worker processes, the wasm sandbox) the table also gives
each mode's decode rate (tokens the backend sampled over the wave's wall time), its ratio to the
in-process one, and the host calls the inferlets made per sampled token (``/metrics``'
``pie_host_calls_total``; in a sandbox each call is a round trip). ``--backend-option
step_ms=10`` gives every dummy batch 10 ms, like a small model's step on a GPU, so what the
runners cost shows beside it.

Exits 1 if any client failed or the server did not end clean.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import re
import resource
import signal
import sys
import tempfile
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from pie_core import config
from pie_core.client import connect, pack_program
from pie_core.server.auth import hash_token

_URL = re.compile(r"ws://127\.0\.0\.1:(\d+)")


class ServeProcess:
    """``pie serve --dummy --no-auth`` (``dummy=False``: the real default model) in a subprocess
    on a free loopback port."""

    def __init__(self, isolation: str, workdir: Path, settings: dict[str, Any], tokens: dict[str, str] | None = None,
                 backend_options: list[str] | None = None, dummy: bool = True) -> None:
        self.isolation = isolation
        self.dummy = dummy  # False: the configured default backend and model
        self.backend_options = backend_options or []
        self.tokens = tokens  # user -> token: auth on with these users; None: --no-auth
        self.workdir = workdir
        self.log_path = workdir / f"serve-{isolation}.log"
        self.settings = settings
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def start(self, timeout: float = 120.0) -> None:
        home = self.workdir / f"home-{self.isolation}"
        home.mkdir()
        doc = config.default_config()
        for key, value in self.settings.items():
            config.set(key, value, config=doc)
        for user, token in (self.tokens or {}).items():
            config.set(f"auth.users.{user}.token_sha256", hash_token(token), config=doc)
        config.save_config(doc, home / "config.toml")
        env = {**os.environ, "PIE_HOME": str(home)}
        auth = [] if self.tokens else ["--no-auth"]
        argv = ["serve", *(["--dummy"] if self.dummy else []), *auth, "--host", "127.0.0.1", "--port", "0", "--status-interval", "0",
                "--isolation", self.isolation, "--data-dir", str(self.workdir / f"data-{self.isolation}")]
        for option in self.backend_options:
            argv += ["--backend-option", option]
        with open(self.log_path, "wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import sys; from pie_core.cli.main import main; sys.exit(main())", *argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        while not (found := _URL.search(self.log_path.read_text(errors="replace"))):
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pie serve did not start (exit {self.proc.returncode}):\n{self.log_tail()}")
            await asyncio.sleep(0.1)
        self.port = int(found[1])

    async def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code (SIGKILL and -9 if it does not stop in ``timeout`` s)."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return int(self.proc.returncode or 0)


def _metrics(http: str, token: str | None = None) -> dict[str, float]:
    """``/metrics`` samples, summed over label sets (with auth on, any user's token reads them)."""
    request = urllib.request.Request(http + "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(pie_[a-z_]+)(?:\{[^}]*\})? (\S+)", line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def _health(http: str) -> dict[str, Any]:
    with urllib.request.urlopen(http + "/health", timeout=30) as resp:
        return dict(json.loads(resp.read()))


async def _client(url: str, index: int, max_tokens: int, token: str | None = None) -> dict[str, Any]:
    """One client: connect, launch, read to ``return``; times are seconds from the start."""
    started = time.perf_counter()
    first: float | None = None
    try:
        async with await connect(url, token) as client:
            prompt = f"Client {index}: write a haiku about paged attention."
            proc = await client.launch("text-completion", {"prompt": prompt, "max_tokens": max_tokens})
            async for event in proc.events():
                if event.kind == "stdout" and first is None:
                    first = time.perf_counter() - started
                elif event.kind == "error":
                    return {"error": f"error event: {event.value}"}
                elif event.kind == "return":
                    return {"latency_s": time.perf_counter() - started, "first_event_s": first,
                            "tokens": int(event.value["tokens"])}
            return {"error": "events ended without a terminal event"}
    except Exception as exc:  # every failure counts; the table shows the first few
        return {"error": f"{type(exc).__name__}: {exc}"}


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    arr = np.asarray(values)
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)), "max": float(arr.max())}


async def _wave(server: ServeProcess, clients: int, max_tokens: int, timeout: float, token: str | None = None) -> dict[str, Any]:
    """``clients`` clients at once; their latencies and what ``/metrics`` counted meanwhile."""
    before = await asyncio.to_thread(_metrics, server.http, token)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    results = await asyncio.wait_for(asyncio.gather(*(_client(server.url, i, max_tokens, token) for i in range(clients))), timeout)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    after = await asyncio.to_thread(_metrics, server.http, token)
    deadline = time.monotonic() + 30  # a finished process leaves the table once its return is delivered
    while (health := await asyncio.to_thread(_health, server.http))["processes"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    pages_in_use = (await asyncio.to_thread(_metrics, server.http, token))["pie_kv_pages_in_use"]
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    batches = after["pie_batches_total"] - before["pie_batches_total"]
    requests = after["pie_batch_requests_total"] - before["pie_batch_requests_total"]
    return {
        "isolation": server.isolation,
        "clients": clients,
        "max_tokens": max_tokens,
        "completed": len(ok),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "latency_s": _percentiles([r["latency_s"] for r in ok]),
        "first_event_s": _percentiles([r["first_event_s"] for r in ok if r["first_event_s"] is not None]),
        "wall_s": wall,
        "tokens_returned": sum(r["tokens"] for r in ok),
        # while every client decodes: its tokens after the first over the time from its first to its return
        "decode_tok_s": (len(ok) * float(np.mean([r["tokens"] - 1 for r in ok]))
                         / float(np.mean([r["latency_s"] - r["first_event_s"] for r in ok])))
        if ok and all(r["first_event_s"] is not None and r["latency_s"] > r["first_event_s"] for r in ok) else 0.0,
        "generated_tokens": int(after["pie_generated_tokens_total"] - before["pie_generated_tokens_total"]),
        "batches": int(batches),
        "host_calls": int(after.get("pie_host_calls_total", 0) - before.get("pie_host_calls_total", 0)),
        "backend_s": after["pie_backend_seconds_total"] - before["pie_backend_seconds_total"],
        "mean_batch_requests": requests / batches if batches else 0.0,
        "load_avg_1m": [load0, load1],
        "processes_left": int(health["processes"]),
        "kv_pages_in_use_after": int(pages_in_use),
    }


HOSTILE_TOKENS = {"honest": "honest-benchmark-token", "mallory": "mallory-benchmark-token"}


async def _attacked_waves(server: ServeProcess, clients: int, max_tokens: int, waves: int, timeout: float,
                          workdir: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """The same waves with every attacker of ``attackers.py`` running as ``mallory`` in a process
    of its own; rows carry the attack stats."""
    victim = workdir / f"victim-{server.isolation}"
    victim.mkdir()
    (victim / "Pie.toml").write_text('[package]\nname = "honest-private"\nversion = "1.0.0"\ndescription = "only honest may run it"\n')
    (victim / "main.py").write_text("async def main(input):\n    return 'private'\n")
    async with await connect(server.url, HOSTILE_TOKENS["honest"]) as honest:
        program = await honest.install(victim)
    spec = {"url": server.url, "http": server.http, "token": HOSTILE_TOKENS["mallory"], "victim_program": program,
            "victim_sha256": hashlib.sha256(pack_program(victim)).hexdigest(), "attackers": names}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    attackers = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).resolve().parent / "attackers.py"), json.dumps(spec),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert attackers.stdin is not None and attackers.stdout is not None
    rows = []
    try:
        await asyncio.sleep(5)  # let every attacker get going first
        for _ in range(waves):
            rows.append(await _wave(server, clients, max_tokens, timeout, HOSTILE_TOKENS["honest"]))
    finally:
        attackers.stdin.close()
        try:
            out = await asyncio.wait_for(attackers.stdout.read(), 60)
        except TimeoutError:
            attackers.kill()
            out = b""
        await attackers.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the attackers' process is the child reaped meanwhile
    attacker_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    # What the attackers left, once they stopped: their processes end (the sleepers at the wall-time
    # limit); mallory's saved snapshots keep their pages, by design, within mallory's page quota.
    deadline = time.monotonic() + 45
    while (health := await asyncio.to_thread(_health, server.http))["processes"] and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    left = {"processes_left": int(health["processes"]),
            "kv_pages_in_use_after": int((await asyncio.to_thread(_metrics, server.http, HOSTILE_TOKENS["honest"]))["pie_kv_pages_in_use"])}
    attacks = json.loads(out) if out.strip() else [{"name": "attackers", "attempts": 0, "breaches": 1,
                                                     "samples": ["the attacker process gave no report"]}]
    return [{**row, **left, "attacks": attacks, "attacker_cpu_s": attacker_cpu} for row in rows]


async def run_mode(isolation: str, clients: int, max_tokens: int, waves: int, workdir: Path,
                   settings: dict[str, Any], timeout: float, hostile: bool = False,
                   backend_options: list[str] | None = None, attackers: list[str] | None = None) -> list[dict[str, Any]]:
    """Start a server, run ``waves`` waves of ``clients`` concurrent clients one after another
    (then, with ``hostile``, the same waves with attackers beside them), stop it."""
    server = ServeProcess(isolation, workdir, settings, HOSTILE_TOKENS if hostile else None, backend_options)
    token = HOSTILE_TOKENS["honest"] if hostile else None
    await server.start()
    rows = []
    try:
        # One client first: the first launch imports the SDK (xgrammar, torch) and the first decode
        # builds the tokenizer's byte table, seconds that a wave should not be charged with.
        cold = await _client(server.url, -1, max_tokens, token)
        if "error" in cold:
            raise RuntimeError(f"the warm-up client failed: {cold['error']}\n{server.log_tail()}")
        for wave in range(waves):
            rows.append({**await _wave(server, clients, max_tokens, timeout, token), "wave": wave + 1,
                         "warmup_client_s": cold["latency_s"], "settings": settings, "attacked": False})
        if hostile:
            attacked = await _attacked_waves(server, clients, max_tokens, waves, timeout, workdir, attackers)
            for wave, row in enumerate(attacked):
                rows.append({**row, "wave": wave + 1, "warmup_client_s": cold["latency_s"], "settings": settings,
                             "attacked": True})
    finally:
        code = await server.stop()
    for row in rows:
        row["server_exit_code"] = code
    return rows


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: version(name) for name in ("pie-engine", "websockets", "msgpack", "numpy", "h11")},
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_avg_1m": os.getloadavg()[0],
    }


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| isolation | attackers | wave | clients | ok | errors | p50 s | p99 s | max s | first event p50 / p99 s | wall s "
             "| backend s | batches | mean reqs/batch | tokens | load 1m |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lat, first = r["latency_s"], r["first_event_s"]
        lines.append(
            f"| {r['isolation']} | {'yes' if r.get('attacked') else 'no'} | {r['wave']} | {r['clients']} | {r['completed']} | {r['errors']} | "
            f"{_fmt(lat['p50'])} | {_fmt(lat['p99'])} | {_fmt(lat['max'])} | {_fmt(first['p50'])} / {_fmt(first['p99'])} | "
            f"{r['wall_s']:.2f} | {r['backend_s']:.2f} | {r['batches']} | {r['mean_batch_requests']:.1f} | {r['generated_tokens']} | "
            f"{r['load_avg_1m'][0]:.1f}→{r['load_avg_1m'][1]:.1f} |")
    return "\n".join(lines)


def runner_table(rows: list[dict[str, Any]]) -> str:
    """Decode tok/s per mode (best wave), its ratio to in-process, and host calls per token."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r.get("attacked") and r["completed"] and (r["isolation"] not in best or r["wall_s"] < best[r["isolation"]]["wall_s"]):
            best[r["isolation"]] = r
    base = best.get("inprocess")
    lines = ["| isolation | clients | tokens | wall s | first token p50 s | decode tok/s | vs in-process | "
             "host calls / token | mean reqs/batch |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in best.items():
        rate = r["decode_tok_s"]
        ratio = f"{rate / base['decode_tok_s']:.2f}x" if base and base["decode_tok_s"] else "—"
        per = r["host_calls"] / r["generated_tokens"] if r["generated_tokens"] else 0.0
        lines.append(f"| {mode} | {r['clients']} | {r['generated_tokens']} | {r['wall_s']:.2f} | "
                     f"{_fmt(r['first_event_s']['p50'])} | {rate:.0f} | {ratio} | {per:.2f} | {r['mean_batch_requests']:.1f} |")
    return "\n".join(lines)


def clean(r: dict[str, Any]) -> bool:
    if r.get("attacked"):  # attackers may still hold their own pages and processes at the wave's end
        return r["errors"] == 0 and r["server_exit_code"] == 0 and not any(a["breaches"] for a in r["attacks"])
    return (r["errors"] == 0 and r["processes_left"] == 0 and (r.get("attacked") or r["kv_pages_in_use_after"] == 0)
            and r["server_exit_code"] == 0)  # under attack, mallory's snapshots keep pages (within her quota)


def hostile_verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Failures of the --hostile criteria: honest p99 with attackers more than 2x the baseline's."""
    out = []
    for mode in sorted({r["isolation"] for r in rows if r.get("attacked")}):
        base = max(r["latency_s"]["p99"] or 0 for r in rows if r["isolation"] == mode and not r.get("attacked"))
        hit = max(r["latency_s"]["p99"] or float("inf") for r in rows if r["isolation"] == mode and r.get("attacked"))
        ratio = hit / base if base else float("inf")
        cpu = max(r.get("attacker_cpu_s", 0.0) for r in rows if r["isolation"] == mode and r.get("attacked"))
        print(f"{mode}: honest p99 {base:.2f} s alone, {hit:.2f} s with attackers ({ratio:.2f}x); the attackers' own "
              f"process used {cpu:.1f} CPU s of this machine meanwhile")
        if ratio > 2.0:
            out.append(f"{mode}: honest p99 grew {ratio:.2f}x under attack (limit 2x)")
    return out


def attack_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| isolation | attacker | attempts | breaches | sample |", "|---|---|---:|---:|---|"]
    for r in rows:
        if r.get("attacked") and r["wave"] == 1:
            for a in r["attacks"]:
                sample = (a["samples"][0] if a["samples"] else "").replace("|", "\\|")[:100]
                lines.append(f"| {r['isolation']} | {a['name']} | {a['attempts']} | {a['breaches']} | {sample} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients per wave (default: 100)")
    parser.add_argument("--process-clients", type=int, help="clients for --isolation process (default: --clients)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens each client generates (default: 16)")
    parser.add_argument("--waves", type=int, default=1, help="waves per mode, one after another on one server (default: 1)")
    parser.add_argument("--isolation", choices=["both", "all", "inprocess", "process", "wasm"], default="both",
                        help="both: inprocess and process; all: those and wasm (default: both)")
    parser.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to pie serve, e.g. step_ms=10 for the dummy's step time (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for the server's config.toml, e.g. server.worker_start_s=0 (repeatable)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one wave may take (default: 600)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--hostile", action="store_true",
                        help="auth on; after the honest waves, repeat them with one attacker per class running beside them")
    parser.add_argument("--attackers", help="with --hostile: only these classes of attackers.py, comma-separated "
                        "(default: all), to see what each costs the honest clients")
    args = parser.parse_args()
    if min(args.clients, args.process_clients or 1, args.max_tokens, args.waves) < 1:
        parser.error("--clients, --process-clients, --max-tokens and --waves must be >= 1")
    settings = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            parser.error(f"--set takes KEY=VALUE, e.g. server.worker_start_s=0; got {item!r}")
        settings[key.strip()] = config.parse_value(value.strip())
    info = machine()
    print(f"{info['cpus']} CPUs · Python {info['python']} · " +
          " · ".join(f"{k} {v}" for k, v in info["packages"].items()) + f" · load {info['load_avg_1m']:.2f}", flush=True)
    modes = {"both": ["inprocess", "process"], "all": ["inprocess", "process", "wasm"]}.get(args.isolation, [args.isolation])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pie-load-") as tmp:
        for mode in modes:
            n = (args.process_clients or args.clients) if mode == "process" else args.clients
            print(f"{mode}: {args.waves} × {n} clients × text-completion, max_tokens {args.max_tokens} …",
                  file=sys.stderr, flush=True)
            rows += asyncio.run(run_mode(mode, n, args.max_tokens, args.waves, Path(tmp), settings, args.timeout,
                                         args.hostile, args.backend_option,
                                         args.attackers.split(",") if args.attackers else None))
    print(table(rows))
    print(runner_table(rows))
    failures = hostile_verdict(rows) if args.hostile else []
    if args.hostile:
        print(attack_table(rows))
    for failure in failures:
        print(f"NOT CLEAN: {failure}")
    for r in rows:
        if r["wave"] == 1:
            print(f"{r['isolation']}: warm-up client (the first after start, alone) {r['warmup_client_s']:.2f} s")
        for sample in r["error_samples"]:
            print(f"{r['isolation']} wave {r['wave']} error: {sample}")
        if not clean(r):
            print(f"{r['isolation']} wave {r['wave']}: NOT CLEAN: errors {r['errors']}, processes left "
                  f"{r['processes_left']}, KV pages in use {r['kv_pages_in_use_after']}, server exit code {r['server_exit_code']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "args": {k: str(v) for k, v in vars(args).items()}, "runs": rows},
                                        indent=2))
    return 0 if all(clean(r) for r in rows) and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
