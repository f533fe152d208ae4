"""The coverage report: every case's outcome grouped by surface, as a rich table and as JSON.

Outcomes are ``passed``, ``failed`` (a failed check, an error in setup or teardown, or a case
not run because the backend did not bind or load) and ``not supported`` (any skip: a feature the
backend does not declare, or numerics turned off). A skipped case is never counted as passed.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["SURFACES", "NOT_RUN", "CaseResult", "SuiteReport"]

SURFACES = (
    "contract",
    "forward",
    "kv_paging",
    "batching",
    "chunked_prefill",
    "attention_masks",
    "logit_masks",
    "samplers",
    "probes",
    "copy_pages",
    "speculation",
    "adapters",
    "limits",
)
"""Surfaces in report order (one module of cases each)."""

OUTCOMES = ("passed", "failed", "not_supported")

NOT_RUN = "not run: "
"""Reason prefix of the cases counted as failed without running (the backend did not load)."""


@dataclass(slots=True)
class CaseResult:
    """One case: its node id, surface, outcome, a one-line reason, and its duration."""

    case: str
    surface: str
    outcome: str = "passed"
    reason: str = ""
    duration: float = 0.0


@dataclass(slots=True)
class SuiteReport:
    """Outcomes of one suite run, plus what was tested."""

    backend: str
    header: dict[str, Any] = field(default_factory=dict)
    cases: dict[str, CaseResult] = field(default_factory=dict)

    def record(self, case: str, surface: str, when: str, outcome: str, reason: str, duration: float) -> None:
        """Fold one pytest phase report (setup, call or teardown) into the case's outcome."""
        result = self.cases.setdefault(case, CaseResult(case, surface))
        result.duration += duration
        if result.outcome == "failed":
            return
        if outcome == "failed":
            result.outcome, result.reason = "failed", reason
        elif outcome == "skipped":
            result.outcome, result.reason = "not_supported", reason

    def not_run(self, case: str, surface: str, why: str) -> None:
        """Count a case that never ran as failed, with the reason ``not run: why``."""
        self.cases[case] = CaseResult(case, surface, "failed", NOT_RUN + why)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{surface: {outcome: count}}`` in report order (surfaces with no cases left out)."""
        table: dict[str, dict[str, int]] = {}
        extra = sorted({c.surface for c in self.cases.values()} - set(SURFACES))
        for surface in (*SURFACES, *extra):
            rows = [c for c in self.cases.values() if c.surface == surface]
            if rows:
                table[surface] = {o: sum(c.outcome == o for c in rows) for o in OUTCOMES}
        return table

    def totals(self) -> dict[str, int]:
        return {o: sum(c.outcome == o for c in self.cases.values()) for o in OUTCOMES}

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            **self.header,
            "totals": self.totals(),
            "surfaces": self.counts(),
            "cases": [asdict(c) for c in self.cases.values()],
        }

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    def render(self, width: int = 100, color: bool = False) -> str:
        """The table (surfaces x outcomes), then failed cases and not-supported reasons."""
        console = Console(file=io.StringIO(), width=width, force_terminal=color, color_system="auto" if color else None)
        h = self.header
        facts = [f"{k} {h[k]}" for k in ("version", "contract", "device", "dtype", "numerics") if h.get(k)]
        if h.get("tolerance"):
            facts.append(f"tolerance {h['tolerance']}")
        if h.get("options"):
            facts.append("options " + " ".join(f"{k}={v}" for k, v in h["options"].items()))
        console.print(
            f"Pie conformance: {self.backend}  ({' · '.join(facts)})", markup=False, highlight=False, soft_wrap=True
        )
        if "features" in h:
            console.print(f"declared features: {', '.join(h['features']) or 'none'}", markup=False, highlight=False)
        if h.get("error"):  # one line, however wide
            console.print(f"error: {h['error']}", style="red", markup=False, highlight=False, soft_wrap=True)
        table = Table()
        table.add_column("surface")
        table.add_column("passed", justify="right", style="green")
        table.add_column("failed", justify="right", style="red")
        table.add_column("not supported", justify="right", style="yellow")
        for surface, n in self.counts().items():
            table.add_row(surface, str(n["passed"]), str(n["failed"]), str(n["not_supported"]))
        t = self.totals()
        table.add_section()
        table.add_row("total", str(t["passed"]), str(t["failed"]), str(t["not_supported"]), style="bold")
        console.print(table)
        failed = [c for c in self.cases.values() if c.outcome == "failed" and not c.reason.startswith(NOT_RUN)]
        not_run: dict[str, int] = {}
        for c in self.cases.values():
            if c.outcome == "failed" and c.reason.startswith(NOT_RUN):
                not_run[c.reason] = not_run.get(c.reason, 0) + 1
        if failed or not_run:
            console.print("[bold red]failed cases[/]")
            for c in failed:
                console.print(f"  {c.case}: {c.reason}", markup=False, highlight=False, soft_wrap=True)
            for reason, n in not_run.items():
                console.print(f"  {n} x {reason}", markup=False, highlight=False, soft_wrap=True)
        reasons: dict[str, list[str]] = {}
        for c in self.cases.values():
            if c.outcome == "not_supported":
                reasons.setdefault(c.reason, []).append(c.surface)
        if reasons:
            console.print("[bold yellow]not supported[/]")
            for reason, surfaces in sorted(reasons.items()):
                where = ", ".join(sorted(set(surfaces)))
                console.print(f"  {len(surfaces)} x {reason} ({where})", markup=False, highlight=False, soft_wrap=True)
        out = console.file
        assert isinstance(out, io.StringIO)
        return out.getvalue()
