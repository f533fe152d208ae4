"""``pie examples``: the example inferlets ``pie run NAME`` finds, with their parameters."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from pie_core.cli.console import stdout_console
from pie_core.runtime.library import list_examples

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("examples", help="list the example inferlets (run one with 'pie run NAME')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--paths", action="store_true", help="add the folder of each example (to read or copy it)")
    p.set_defaults(handler=_run)


def _parameters(manifest: Any) -> str:
    return " ".join(f"--{name.replace('_', '-')}" for name in manifest.parameters)


def _run(args: argparse.Namespace) -> int:
    examples = list_examples()
    if args.json:
        print(json.dumps([{"name": m.name, "version": m.version, "description": m.description, "path": str(m.root),
                           "parameters": {n: {"type": p.type, "optional": p.optional, "default": p.default,
                                              "description": p.description} for n, p in m.parameters.items()}}
                          for m in examples], indent=2))
        return 0
    table = Table(title="Examples: pie run NAME -- --param value")
    for col in ("name", "description", "parameters", *(("path",) if args.paths else ())):
        table.add_column(col)
    for m in examples:
        table.add_row(m.name, m.description, _parameters(m), *((str(m.root),) if args.paths else ()))
    stdout_console().print(table if examples else "no examples found (reinstall pie-engine: its wheel carries them)")
    return 0
