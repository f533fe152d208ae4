"""``pie backends``: what is installed, with versions and capabilities."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pie_core.cli.console import stdout_console
from rich.table import Table

from pie_core.backend import BackendWorker
from pie_core.plugins import available_backends, bind_backend

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("backends", help="list installed backends")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_run)


def _describe(name: str) -> dict[str, Any]:
    entry = available_backends()[name]
    row: dict[str, Any] = {"name": name, "distribution": entry.distribution, "entry_point": entry.entry_point.value}
    try:
        worker = BackendWorker(bind_backend(name))
        try:
            info = worker.call(lambda backend: backend.info())
        finally:
            worker.close()
        row.update(version=info.version, contract=info.contract_version, description=info.description)
        row.update(features=sorted(info.features), devices=list(info.devices))
        row["status"] = "ok"
    except Exception as exc:  # a broken plugin is listed with its error, not hidden
        row["status"] = f"error: {exc}"
    return row


def _run(args: argparse.Namespace) -> int:
    rows = [_describe(name) for name in sorted(available_backends())]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="Installed backends")
    for col in ("name", "version", "contract", "devices", "features", "distribution", "status"):
        table.add_column(col)
    for r in rows:
        status = r["status"]
        table.add_row(
            r["name"],
            r.get("version", "?"),
            r.get("contract", "?"),
            ", ".join(r.get("devices", [])),
            ", ".join(r.get("features", [])),
            r["distribution"],
            "[green]ok[/]" if status == "ok" else f"[red]{status}[/]",
        )
    console = stdout_console()
    console.print(table)
    for r in rows:
        if r.get("description"):
            console.print(f"[bold]{r['name']}[/]: {r['description']}")
    return 0
