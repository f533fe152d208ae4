"""``pie model list`` and ``pie model info NAME``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from pie_core.cli.console import stdout_console
from rich.table import Table

from pie_core.models.registry import list_models, model_info

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("model", help="list and inspect models")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="SUBCOMMAND")
    ls = msub.add_parser("list", help="models from config and the built-in ones")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(handler=_list)
    info = msub.add_parser("info", help="architecture, tokenizer and file facts of one model")
    info.add_argument("name", nargs="?", help="model name (default: the configured default)")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(handler=_info)


def _size(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _list(args: argparse.Namespace) -> int:
    rows = list_models()
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    table = Table(title="Models")
    for col in ("name", "arch", "format", "size", "status", "path"):
        table.add_column(col)
    for r in rows:
        name = f"[bold]{r.name}[/] (default)" if r.default else r.name
        status = "[green]available[/]" if r.available else f"[yellow]{r.note or 'not installed'}[/]"
        table.add_row(name, r.arch or "-", r.format or "-", _size(r.size), status, r.path or "-")
    stdout_console().print(table)
    return 0


def _info(args: argparse.Namespace) -> int:
    info = model_info(args.name)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    table = Table(title=f"Model {info.get('name', args.name)}", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in _flatten(info):
        table.add_row(key, str(value))
    stdout_console().print(table)
    return 0


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        else:
            rows.append((f"{prefix}{k}", v))
    return rows
