"""The check's report: one JSON document and its Markdown rendering.

The JSON holds the run (command, device, budget, total seconds) and, per phase, its status
(``ok``, ``failed``, ``stopped`` at its deadline, ``skipped``), seconds, deadline share, and the
phase's record (facts, tables, checks; :mod:`.record`). The Markdown is what goes into
docs/performance.md: a phase table, every check with its verdict, then each phase's tables and facts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_reports", "render_markdown"]

_MARK = {True: "MET", False: "FAILED", None: "—"}


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _facts(facts: dict[str, Any]) -> list[str]:
    out = []
    for key, value in facts.items():
        if key.startswith(("traceback", "log_tail")):
            continue
        text = json.dumps(value) if isinstance(value, (dict, list)) else _cell(value)
        out.append(f"- {key}: {text}")
    return out


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# GPU check: {report['device_name']}",
        "",
        f"`{report['command']}` — device {report['device']}{' (tiny)' if report['tiny'] else ''}, "
        f"budget {report['budget_s']:.0f} s, total {report['total_s']:.1f} s, started {report['started']}",
        "",
        "| phase | status | seconds | deadline at (s) |",
        "|---|---|---:|---:|",
    ]
    for p in report["phases"]:
        lines.append(f"| {p['name']} | {p['status']} | {p['seconds']:.1f} | {p['deadline_s']:.0f} |")
    checks = [(p["name"], c) for p in report["phases"] for c in p["record"].get("checks", [])]
    if checks:
        lines += ["", "| check | verdict | detail |", "|---|---|---|"]
        for phase, c in checks:
            lines.append(f"| {phase}: {_cell(c['name'])} | {_MARK[c['ok']]} | {_cell(c['detail'])} |")
    for p in report["phases"]:
        rec = p["record"]
        lines += ["", f"## {p['name']} — {p['status']}, {p['seconds']:.1f} s"]
        if p.get("error"):
            lines += ["", f"error: {_cell(p['error'])}"]
        for t in rec.get("tables", []):
            if not t["rows"]:
                lines += ["", f"{t['title']}: none"]
                continue
            lines += ["", f"{t['title']}:", "", "| " + " | ".join(t["columns"]) + " |",
                      "|" + "---|" * len(t["columns"])]
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t["rows"]]
        facts = _facts(rec.get("facts", {}))
        if facts:
            lines += [""] + facts
    return "\n".join(lines) + "\n"


def write_reports(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` under ``out`` (atomically, so a kill leaves the last whole one)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "report.json", out / "report.md")
    for path, text in zip(paths, (json.dumps(report, indent=1) + "\n", render_markdown(report))):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return paths
