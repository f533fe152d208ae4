"""What the server reports: Prometheus text for ``/metrics`` and the periodic status line."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pie_core.runtime import host_api

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["RateMeter", "token_totals", "prometheus_text", "status_line"]


@dataclass(slots=True)
class RateMeter:
    """Generated and input tokens per second over the interval between two :meth:`sample` calls.

    *Generated* tokens are the ones the backend sampled (speculative verification rows
    included); *input* tokens are every token a batch ran (prompts, drafts and each step's
    fed-back token).
    """

    last_generated: int = 0
    last_input: int = 0
    last_time: float = 0.0
    generated_rate: float = 0.0
    input_rate: float = 0.0

    def sample(self, generated: int, input: int, now: float | None = None) -> None:
        """Record the running totals; the rates cover the time since the previous call."""
        now = time.monotonic() if now is None else now
        if self.last_time and now > self.last_time:
            span = now - self.last_time
            self.generated_rate = max(0, generated - self.last_generated) / span
            self.input_rate = max(0, input - self.last_input) / span
        self.last_generated, self.last_input, self.last_time = generated, input, now


def token_totals(server: PieServer) -> tuple[int, int]:
    """(generated, input) tokens over every model since the engine started."""
    models = server.engine.all_replicas()
    return sum(m.batcher.stats.sampled for m in models), sum(m.batcher.stats.tokens for m in models)


def prometheus_text(server: PieServer) -> str:
    """Counters and gauges in the Prometheus text exposition format (0.0.4)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

    models = server.engine.all_replicas()

    def per_model(get: object) -> list[tuple[str, float]]:
        return [(f'{{{_where(server, m)}}}', float(get(m))) for m in models]  # type: ignore[operator]

    metric("pie_batches_total", "counter", "Batches fired on the backend.", per_model(lambda m: m.batcher.stats.batches))
    metric("pie_batch_requests_total", "counter", "Forward requests run in batches.", per_model(lambda m: m.batcher.stats.requests))
    metric("pie_input_tokens_total", "counter", "Input tokens run in batches (prompts, drafts, fed-back tokens).",
           per_model(lambda m: m.batcher.stats.tokens))
    metric("pie_generated_tokens_total", "counter", "Tokens sampled by the backend.",
           per_model(lambda m: m.batcher.stats.sampled))
    metric("pie_backend_seconds_total", "counter", "Time spent in the backend.", per_model(lambda m: m.batcher.stats.backend_seconds))
    hist: list[tuple[str, float]] = []
    for m in models:
        sizes = m.batcher.stats.sizes
        bounds = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, *sizes})
        for bound in bounds:
            hist.append((f'_bucket{{{_where(server, m)},le="{bound}"}}', float(sum(c for s, c in sizes.items() if s <= bound))))
        hist.append((f'_bucket{{{_where(server, m)},le="+Inf"}}', float(sum(sizes.values()))))
        hist.append((f'_sum{{{_where(server, m)}}}', float(sum(s * c for s, c in sizes.items()))))
        hist.append((f'_count{{{_where(server, m)}}}', float(sum(sizes.values()))))
    lines.append("# HELP pie_batch_size Requests per batch.")
    lines.append("# TYPE pie_batch_size histogram")
    lines.extend(f"pie_batch_size{suffix} {value:g}" for suffix, value in hist)
    metric("pie_queue_length", "gauge", "Forward requests waiting for a batch.", per_model(lambda m: m.batcher.queued))
    metric("pie_kv_pages_in_use", "gauge", "KV pages held (not free, not idle in the prefix cache).",
           per_model(lambda m: m.pool.num_pages - m.pool.available_count))
    metric("pie_kv_pages_total", "gauge", "KV pages in the pool.", per_model(lambda m: m.pool.num_pages))
    metric("pie_tokens_per_second", "gauge", "Generated (sampled) tokens per second over the last status interval.",
           [("", server.rate.generated_rate)])
    metric("pie_input_tokens_per_second", "gauge", "Input tokens per second over the last status interval.",
           [("", server.rate.input_rate)])
    procs = server.processes.all()
    states = ("attached", "detached", "finished")
    metric("pie_processes", "gauge", "Inferlet processes by state.",
           [(f'{{state="{s}"}}', float(sum(1 for p in procs if p.state == s))) for s in states])
    metric("pie_connections", "gauge", "Open WebSocket connections.", [("", float(server.connection_count))])
    metric("pie_host_calls_total", "counter", "Host calls inferlets made (in a sandbox each is a round trip).",
           [(f'{{call="{module}.{name}"}}', float(n)) for (module, name), n in sorted(host_api.CALLS.items())])
    _per_user(server, metric, models)
    lines.extend(server.request_metrics.lines())
    return "\n".join(lines) + "\n"


def _where(server: PieServer, m: Any) -> str:
    """The labels of a replica's samples: ``model``, and ``replica`` when the model has several."""
    several = len(server.engine.replicas.get(m.name, ())) > 1
    return f'model="{_label(m.name)}"' + (f',replica="{m.index}"' if several else "")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _per_user(server: PieServer, metric: Any, models: list[Any]) -> None:
    """Gauges labelled by ``user``: what each user holds against its quotas (docs/server.md). The
    label is the user's pseudonym (:meth:`Authenticator.pseudonym`), never its name: any user's
    token reads this page."""
    procs = server.processes.all()
    who = server.auth.pseudonym
    pages = sorted((f'{{user="{_label(who(u))}",{_where(server, m)}}}', float(n))
                   for m in models for u, n in m.pool.accounts.held().items())
    metric("pie_user_kv_pages", "gauge", "KV pages held by a user's contexts and snapshots (quota server.quotas.pages).", pages)
    credits: list[tuple[str, float]] = []
    for m in models:
        balances: dict[str, float] = {}
        for wallet in m.market.ledger.wallets.values():
            balances[wallet.user] = balances.get(wallet.user, 0.0) + wallet.balance
        credits.extend(sorted((f'{{user="{_label(who(u))}",{_where(server, m)}}}', b) for u, b in balances.items()))
    metric("pie_user_credits", "gauge", "Credits a user's live inferlets hold in a model's KV-page market "
           "(their endowments are bounded by quota server.quotas.credits).", credits)

    def by_user(counts: Mapping[str, float]) -> list[tuple[str, float]]:
        return sorted((f'{{user="{_label(who(u))}"}}', float(n)) for u, n in counts.items())

    for user in {p.user for p in procs}:
        server.processes.scratch.refresh(user)  # measured in a thread; this scrape shows the last one
    running: dict[str, float] = {}
    buffered: dict[str, float] = {}
    for p in procs:
        running[p.user] = float(server.processes.running_of(p.user))
        if p.pending_bytes:
            buffered[p.user] = buffered.get(p.user, 0) + p.pending_bytes
    metric("pie_user_snapshots", "gauge", "Context snapshots a user keeps (quota server.quotas.snapshots).",
           by_user(server.engine.snapshots.counts()))
    metric("pie_user_adapter_bytes", "gauge", "Bytes of LoRA adapters a user holds (quota server.quotas.adapter_bytes).",
           by_user(server.engine.adapters.bytes_held()))
    metric("pie_user_processes", "gauge", "Inferlets a user runs (quota server.quotas.processes).", by_user(running))
    metric("pie_user_connections", "gauge", "Open connections of a user (quota server.quotas.connections).",
           by_user(server.connections.of_user()))
    metric("pie_user_event_bytes", "gauge", "Bytes of events buffered undelivered, over a user's processes.", by_user(buffered))
    metric("pie_user_scratch_bytes", "gauge", "Disk bytes in a user's scratch directory at its last measurement.",
           by_user(server.processes.scratch.sizes()))


def status_line(server: PieServer) -> str:
    """One line for the log: inferlets, KV pages in use, generated and input tokens/s, queue."""
    server.rate.sample(*token_totals(server))
    procs = server.processes.all()
    running = sum(1 for p in procs if not p.finished)
    detached = sum(1 for p in procs if p.state == "detached")
    replicas = server.engine.all_replicas()
    used = sum(m.pool.num_pages - m.pool.available_count for m in replicas)
    total = sum(m.pool.num_pages for m in replicas)
    queued = sum(m.batcher.queued for m in replicas)
    return (
        f"inferlets [bold]{running}[/] running ({detached} detached) · KV {used}/{total} pages · "
        f"{server.rate.generated_rate:,.0f} tok/s generated ({server.rate.input_rate:,.0f} in) · "
        f"queue {queued} · clients {server.connection_count}"
    )
