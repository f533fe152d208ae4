"""Latency histograms and HTTP request counts for ``/metrics``, in fixed memory.

Histograms have fixed buckets (Prometheus ``le`` bounds); labels come from closed sets (the
served models, the server's routes, HTTP status codes), so no client can grow them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["Histogram", "RequestMetrics", "TTFT_BUCKETS", "ITL_BUCKETS", "E2E_BUCKETS"]

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(slots=True)
class Histogram:
    """Counts of observations at or below each bound (cumulated when rendered), their sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times (a step that produced several tokens at once)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def lines(self, name: str, labels: str) -> list[str]:
        """Prometheus samples: ``name_bucket{labels,le=...}`` (cumulative), ``_sum``, ``_count``."""
        out, running = [], 0
        sep = "," if labels else ""
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.total:.6g}" if labels else f"{name}_sum {self.total:.6g}")
        out.append(f"{name}_count{{{labels}}} {self.count}" if labels else f"{name}_count {self.count}")
        return out


class RequestMetrics:
    """The server's request latencies (per model) and HTTP responses (per route and status)."""

    def __init__(self, models: list[str], routes: list[str]) -> None:
        self.ttft = {m: Histogram(TTFT_BUCKETS) for m in models}
        self.itl = {m: Histogram(ITL_BUCKETS) for m in models}
        self.e2e = {m: Histogram(E2E_BUCKETS) for m in models}
        self.routes = frozenset(routes)
        self.responses: dict[tuple[str, int], int] = {}

    def response(self, path: str, status: int) -> None:
        """Count one HTTP response; paths outside the server's routes count as ``other``."""
        route = path.rstrip("/") or "/"
        key = (route if route in self.routes else "other", status if 100 <= status <= 599 else 0)
        self.responses[key] = self.responses.get(key, 0) + 1

    def lines(self) -> list[str]:
        out: list[str] = []
        for name, table, text in (
            ("pie_request_ttft_seconds", self.ttft, "Time from a generation request's arrival to its first token."),
            ("pie_request_inter_token_seconds", self.itl, "Time between successive tokens of one choice."),
            ("pie_request_e2e_seconds", self.e2e, "Time from a generation request's arrival to its last token."),
        ):
            out += [f"# HELP {name} {text}", f"# TYPE {name} histogram"]
            for model, hist in table.items():
                out += hist.lines(name, f'model="{_label(model)}"')
        out += ["# HELP pie_http_requests_total HTTP responses by route and status.",
                "# TYPE pie_http_requests_total counter"]
        out += [f'pie_http_requests_total{{route="{_label(r)}",status="{s}"}} {n}'
                for (r, s), n in sorted(self.responses.items())]
        return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
