"""Agents as inferlets against the same agents as client loops over our OpenAI endpoint (issue 34).

    python benchmarks/agents.py --backend-option step_ms=10                  # dummy, GPU-like step
    python benchmarks/agents.py --agents 8 32 --real --reps 1                # the real default model
    python benchmarks/agents.py --agents 32 --isolation wasm --backend-option step_ms=10
    python benchmarks/agents.py --agents 32 --text --backend-option step_ms=10   # + /v1/completions

One ``pie serve`` (``--isolation``, default inprocess; the dummy backend unless ``--real``) serves
every side. For each number of concurrent agents the sides run one after another, in an order
that alternates between repetitions (``--reps``), and each run is timed alone:

- ``inferlet``: each agent is one ``agent-react`` inferlet (``examples/agent-react``), launched
  over its own WebSocket connection; the loop, the tools and the KV cache stay in the server.
- ``chat client``: the same ReAct loop as a Python client over ``/v1/chat/completions`` with the
  ``openai`` package, as people write agents: a growing ``messages`` list re-sent every turn.
  All agents share one ``AsyncOpenAI`` (keep-alive connection pool) and run concurrently on one
  asyncio loop; the server's prefix cache serves their repeated history as it serves anyone's.
- with ``--text``: ``text inferlet`` (``agent-react`` with ``mode=text``) against ``completions
  client``: one plain transcript, grown by the client and re-sent to ``/v1/completions``.
- ``completion inferlet`` / ``completion client``: plain completion, no agent
  (``text-completion`` against one streamed ``/v1/chat/completions`` request, ``--turns ×
  --max-tokens`` tokens each, both streaming the reply): what an inferlet costs where it brings
  no advantage.

Both agent sides parse actions, call the tools and word observations with the same code
(``examples/agent-react/react.py``), with greedy sampling, ``--max-tokens`` per turn, ``--turns``
turns and a ``--tool-delay`` s sleep per tool call. Every run starts its system prompt with a
fresh nonce, so no run finds another run's conversations in the prefix cache (it would compute
almost nothing); within a run the agents share the system prompt, as one application's agents do.

Per run: wall time, the CPU seconds the server process (and its finished workers) and this
client process spent (clients share the machine with the server here: on 2 cores the client's
own CPU, the ``openai`` package parsing each streamed chunk, slows the server too), per-agent latency p50/p99, generated tokens per second over the wall time
(the server's ``/metrics``), the input tokens the engine computed and the batches it fired (both
from ``/metrics``), and KV pages in use sampled every 50 ms (mean and peak). The summary gives
each pair's throughput ratio (client wall / inferlet wall, best repetition of each). After every
run the server must hold no KV page and no process.

``--trace FILE`` has the server append one line per batch (``PIE_TRACE_BATCHES``, see
``pie_core/scheduler/trace.py``) and adds a table of what each run's batches were: requests and
decode rows per batch, prefill chunks and their tokens, KV lengths, and backend seconds per
batch, split into decode-only batches and batches with a prefill chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_load import ServeProcess, _health, _metrics, machine  # noqa: E402

from pie_core.client import connect  # noqa: E402

_REACT = Path(__file__).resolve().parents[1] / "examples" / "agent-react" / "react.py"
_spec = importlib.util.spec_from_file_location("agent_react_protocol", _REACT)
react = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(react)

TASKS = [
    "Which is older, the Eiffel Tower or the Statue of Liberty, and by how many years?",
    "How many more people live in New York City than in Paris?",
    "What does a KV cache save a transformer from recomputing?",
    "Which country gave the Statue of Liberty, and what is its capital?",
]


def _task(agent: int) -> str:
    return f"(agent {agent}) {TASKS[agent % len(TASKS)]}"


class Settings:
    def __init__(self, args: argparse.Namespace, nonce: str) -> None:
        self.turns = args.turns
        self.max_tokens = args.max_tokens
        self.delay = args.tool_delay
        self.parallel = args.parallel_tools
        self.system = f"[session {nonce}] {react.SYSTEM}"
        self.model = ""


# -- the inferlet sides -------------------------------------------------------------------------
async def _launch(url: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    async with await connect(url) as client:
        proc = await client.launch(name, args)
        async for event in proc.events():
            if event.kind == "return":
                return dict(event.value)
            if event.kind == "error":
                raise RuntimeError(f"{name} failed: {event.value}")
    raise RuntimeError(f"{name}: events ended without a terminal event")


def inferlet_agent(mode: str) -> Callable[[ServeProcess, Settings, int], Awaitable[int]]:
    async def agent(server: ServeProcess, s: Settings, i: int) -> int:
        out = await _launch(server.url, "agent-react", {
            "task": _task(i), "turns": s.turns, "max_tokens": s.max_tokens, "tool_delay_s": s.delay,
            "parallel_tools": s.parallel, "mode": mode, "stop_at_finish": False, "system": s.system})
        return int(out["turns"])
    return agent


async def completion_inferlet(server: ServeProcess, s: Settings, i: int) -> int:
    await _launch(server.url, "text-completion", {"system": s.system, "prompt": _task(i),
                                                   "max_tokens": s.turns * s.max_tokens})
    return 1


# -- the client sides ---------------------------------------------------------------------------
async def chat_client(client: openai.AsyncOpenAI, s: Settings, i: int) -> int:
    tools = react.Tools(s.delay)
    messages = [{"role": "system", "content": s.system}, {"role": "user", "content": _task(i)}]
    for _ in range(s.turns):
        reply = await client.chat.completions.create(model=s.model, messages=messages, max_tokens=s.max_tokens,
                                                     temperature=0)
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        results = await tools.run(react.actions(text, s.parallel))
        messages.append({"role": "user", "content": react.observation(results)})
    return s.turns


async def completions_client(client: openai.AsyncOpenAI, s: Settings, i: int) -> int:
    tools = react.Tools(s.delay)
    prompt = f"{s.system}\nQuestion: {_task(i)}\n"
    for _ in range(s.turns):
        reply = await client.completions.create(model=s.model, prompt=prompt, max_tokens=s.max_tokens, temperature=0)
        text = reply.choices[0].text
        results = await tools.run(react.actions(text, s.parallel))
        prompt += f"{text}\n{react.observation(results)}\n"
    return s.turns


async def completion_client(client: openai.AsyncOpenAI, s: Settings, i: int) -> int:
    stream = await client.chat.completions.create(model=s.model, max_tokens=s.turns * s.max_tokens, temperature=0,
                                                  stream=True, messages=[{"role": "system", "content": s.system},
                                                                         {"role": "user", "content": _task(i)}])
    async for _ in stream:  # text-completion streams its reply too: like for like
        pass
    return 1


SIDES: dict[str, tuple[str, Callable[..., Awaitable[int]]]] = {
    "inferlet": ("server", inferlet_agent("chat")),
    "chat client": ("openai", chat_client),
    "text inferlet": ("server", inferlet_agent("text")),
    "completions client": ("openai", completions_client),
    "completion inferlet": ("server", completion_inferlet),
    "completion client": ("openai", completion_client),
}
PAIRS = [("inferlet", "chat client"), ("text inferlet", "completions client"),
         ("completion inferlet", "completion client")]


def _server_cpu(server: ServeProcess) -> float:
    """CPU seconds of the server process and its finished children (workers) so far."""
    assert server.proc is not None
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


# -- one run --------------------------------------------------------------------------------------
async def _pages(server: ServeProcess, samples: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append((await asyncio.to_thread(_metrics, server.http))["pie_kv_pages_in_use"])
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass


async def run_side(server: ServeProcess, side: str, agents: int, args: argparse.Namespace) -> dict[str, Any]:
    kind, agent = SIDES[side]
    s = Settings(args, secrets.token_hex(6))
    client = None
    if kind == "openai":
        client = openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="none", max_retries=0, timeout=args.timeout)
        s.model = (await client.models.list()).data[0].id
    target = client if client is not None else server

    async def timed(i: int) -> float:
        t0 = time.perf_counter()
        await agent(target, s, i)
        return time.perf_counter() - t0

    before = await asyncio.to_thread(_metrics, server.http)
    cpu0 = _server_cpu(server), time.process_time()
    pages: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_pages(server, pages, stop))
    t0, started = time.perf_counter(), time.time()
    try:
        latencies = await asyncio.wait_for(asyncio.gather(*(timed(i) for i in range(agents))), args.timeout)
    finally:
        wall = time.perf_counter() - t0
        stop.set()
        await sampler
        if client is not None:
            await client.close()
    after = await asyncio.to_thread(_metrics, server.http)
    server_cpu, client_cpu = _server_cpu(server) - cpu0[0], time.process_time() - cpu0[1]
    deadline = time.monotonic() + 30
    while (await asyncio.to_thread(_health, server.http))["processes"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    left = await asyncio.to_thread(_metrics, server.http)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in
             ("pie_generated_tokens_total", "pie_input_tokens_total", "pie_batches_total", "pie_backend_seconds_total")}
    trace = _trace_summary(args.trace, started, started + wall) if args.trace else {}
    return {
        "side": side, "agents": agents, "wall_s": wall, "trace": trace,
        "latency_p50_s": float(np.percentile(latencies, 50)), "latency_p99_s": float(np.percentile(latencies, 99)),
        "generated_tokens": int(delta["pie_generated_tokens_total"]),
        "tok_s": delta["pie_generated_tokens_total"] / wall,
        "input_tokens": int(delta["pie_input_tokens_total"]),
        "batches": int(delta["pie_batches_total"]),
        "backend_s": delta["pie_backend_seconds_total"],
        "pages_mean": float(np.mean(pages)) if pages else 0.0, "pages_peak": int(max(pages, default=0)),
        "pages_left": int(left["pie_kv_pages_in_use"]),
        "server_cpu_s": server_cpu, "client_cpu_s": client_cpu,
    }


def _trace_summary(path: Path, start: float, end: float) -> dict[str, Any]:
    """What the batches fired in ``[start, end]`` were, from the server's batch trace."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    runs = [b for b in lines if start <= b["t"] <= end]
    if not runs:
        return {}
    decode = [b for b in runs if not b["prefill"]]
    mixed = [b for b in runs if b["prefill"]]
    chunks = [n for b in runs for n in b["prefill"]]

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else 0.0

    return {
        "batches": len(runs), "seconds": sum(b["seconds"] for b in runs),
        "requests_mean": mean([b["requests"] for b in runs]), "decode_rows_mean": mean([b["decode_rows"] for b in runs]),
        "prefill_chunks": len(chunks), "prefill_tokens": sum(chunks), "prefill_chunk_p50": float(np.median(chunks)) if chunks else 0.0,
        "kv_total_mean": mean([b["kv_total"] for b in runs]), "kv_max": max(b["kv_max"] for b in runs),
        "decode_batches": len(decode), "decode_s_mean": mean([b["seconds"] for b in decode]),
        "decode_batch_rows_mean": mean([b["requests"] for b in decode]),
        "mixed_batches": len(mixed), "mixed_s_mean": mean([b["seconds"] for b in mixed]),
        "mixed_tokens_mean": mean([b["tokens"] for b in mixed]),
    }


def trace_table(rows: list[dict[str, Any]]) -> str:
    head = ["| side | agents | rep | batches | backend s | requests / batch | decode rows / batch | prefill chunks "
            "| prefill tokens | chunk p50 | KV tokens / batch | decode-only batches: n, rows, s | with prefill: n, tokens, s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out = []
    for r in rows:
        t = r.get("trace")
        if t:
            out.append(f"| {r['side']} | {r['agents']} | {r['rep']} | {t['batches']} | {t['seconds']:.1f} | "
                       f"{t['requests_mean']:.1f} | {t['decode_rows_mean']:.1f} | {t['prefill_chunks']} | "
                       f"{t['prefill_tokens']} | {t['prefill_chunk_p50']:.0f} | {t['kv_total_mean']:.0f} | "
                       f"{t['decode_batches']}, {t['decode_batch_rows_mean']:.1f}, {t['decode_s_mean']:.3f} | "
                       f"{t['mixed_batches']}, {t['mixed_tokens_mean']:.0f}, {t['mixed_s_mean']:.3f} |")
    return "\n".join(head + out)


async def run_all(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    options = list(args.backend_option)
    server = ServeProcess(args.isolation, workdir, {}, None, options, dummy=not args.real)
    await server.start(timeout=600)
    pairs = [p for p in PAIRS if (args.text or p[0] != "text inferlet")
             and (args.completion or p[0] != "completion inferlet")]
    rows = []
    try:
        for side in {s for p in pairs for s in p}:  # warm-up: first launches import the SDK, build tables
            await run_side(server, side, 1, argparse.Namespace(**{**vars(args), "turns": 1}))
        for agents in args.agents:
            for rep in range(args.reps):
                for pair in pairs:
                    for side in (pair if rep % 2 == 0 else pair[::-1]):
                        row = {**await run_side(server, side, agents, args), "rep": rep + 1}
                        print(_line(row), file=sys.stderr, flush=True)
                        rows.append(row)
    finally:
        code = await server.stop()
    for row in rows:
        row["server_exit_code"] = code
    return rows


# -- report -----------------------------------------------------------------------------------------
def _line(r: dict[str, Any]) -> str:
    return (f"| {r['side']} | {r['agents']} | {r['rep']} | {r['wall_s']:.2f} | {r['latency_p50_s']:.2f} | "
            f"{r['latency_p99_s']:.2f} | {r['tok_s']:.0f} | {r['generated_tokens']} | {r['input_tokens']} | "
            f"{r['batches']} | {r['pages_mean']:.0f} / {r['pages_peak']} | {r['server_cpu_s']:.2f} | {r['client_cpu_s']:.2f} |")


def table(rows: list[dict[str, Any]]) -> str:
    head = ["| side | agents | rep | wall s | agent p50 s | agent p99 s | gen tok/s | generated | input tokens computed "
            "| batches | KV pages mean / peak | server CPU s | client CPU s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    return "\n".join(head + [_line(r) for r in rows])


def ratios(rows: list[dict[str, Any]]) -> str:
    """Per pair and agent count: the best run of each side; throughput and p99 ratios."""
    lines = ["| pair | agents | inferlet wall s | client wall s | throughput ratio (client wall / inferlet wall) "
             "| p99 inferlet / client s | input tokens inferlet / client | server CPU s inferlet / client |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for a, b in PAIRS:
        for n in sorted({r["agents"] for r in rows}):
            ra = [r for r in rows if r["side"] == a and r["agents"] == n]
            rb = [r for r in rows if r["side"] == b and r["agents"] == n]
            if ra and rb:
                x, y = min(ra, key=lambda r: r["wall_s"]), min(rb, key=lambda r: r["wall_s"])
                lines.append(f"| {a} vs {b} | {n} | {x['wall_s']:.2f} | {y['wall_s']:.2f} | "
                             f"**{y['wall_s'] / x['wall_s']:.2f}×** | {x['latency_p99_s']:.2f} / {y['latency_p99_s']:.2f} | "
                             f"{x['input_tokens']} / {y['input_tokens']} | {x['server_cpu_s']:.2f} / {y['server_cpu_s']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 8, 32, 64], help="concurrent agents (default: 1 8 32 64)")
    parser.add_argument("--turns", type=int, default=8, help="model turns per agent (default: 8)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per turn (default: 16)")
    parser.add_argument("--tool-delay", type=float, default=0.1, help="seconds per tool call (default: 0.1)")
    parser.add_argument("--parallel-tools", type=int, default=2, help="most actions of a turn run at once (default: 2)")
    parser.add_argument("--reps", type=int, default=2, help="repetitions, sides alternating (default: 2)")
    parser.add_argument("--isolation", choices=["inprocess", "process", "wasm"], default="inprocess")
    parser.add_argument("--real", action="store_true", help="the default model on the default backend, not the dummy")
    parser.add_argument("--text", action="store_true", help="also the text-transcript pair (/v1/completions)")
    parser.add_argument("--no-completion", dest="completion", action="store_false",
                        help="leave out the plain-completion pair")
    parser.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to pie serve, e.g. step_ms=10 (repeatable)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default: 900)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--trace", type=Path, help="the server's per-batch trace file (appended); adds a table")
    args = parser.parse_args()
    if min(min(args.agents), args.turns, args.max_tokens, args.reps) < 1 or args.tool_delay < 0:
        parser.error("--agents, --turns, --max-tokens and --reps must be >= 1, --tool-delay >= 0")
    info = machine()
    print(f"{info['cpus']} CPUs · Python {info['python']} · load {info['load_avg_1m']:.2f} · "
          f"{'real model' if args.real else 'dummy'} {' '.join(args.backend_option)} · isolation {args.isolation}", flush=True)
    if args.trace:
        args.trace = args.trace.resolve()
        os.environ["PIE_TRACE_BATCHES"] = str(args.trace)  # the server inherits it
    with tempfile.TemporaryDirectory(prefix="pie-agents-") as tmp:
        rows = asyncio.run(run_all(args, Path(tmp)))
    print(table(rows))
    print(ratios(rows))
    if args.trace:
        print(trace_table(rows))
    dirty = [r for r in rows if r["pages_left"] or r["server_exit_code"]]
    for r in dirty:
        print(f"NOT CLEAN: {r['side']} at {r['agents']} agents left {r['pages_left']} KV pages "
              f"(server exit {r['server_exit_code']})")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "args": {k: str(v) for k, v in vars(args).items()},
                                         "runs": rows}, indent=2))
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
