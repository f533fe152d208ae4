"""``pie cache list`` and ``pie cache clean``: what Pie keeps on disk, and freeing it."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.table import Table

from pie_core import cache_inventory
from pie_core.cache_inventory import KINDS, CacheEntry
from pie_core.cli.console import stdout_console
from pie_core.models.weights_cache import cache_dir

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("cache", help="what Pie keeps under ~/.cache/pie, by kind and model; clean it")
    csub = p.add_subparsers(dest="cache_command", required=True, metavar="SUBCOMMAND")
    kinds = "; ".join(f"{k}: {v}" for k, v in KINDS.items())
    ls = csub.add_parser("list", help="sizes by kind and model", description=f"Kinds: {kinds}.")
    ls.add_argument("--json", action="store_true", help="every entry, machine-readable")
    ls.set_defaults(handler=_list)
    cl = csub.add_parser("clean", help="delete cached entries (all, or by kind, age or model)",
                         description="Delete what Pie cached; each entry is rebuilt on the next load that needs it "
                         f"(seconds to minutes). Kinds: {kinds}.")
    cl.add_argument("--kind", action="append", choices=list(KINDS), default=[], help="only this kind (repeatable)")
    cl.add_argument("--older-than", metavar="AGE", help="only entries unused for AGE (30d, 12h, 2w; a bare number is days)")
    cl.add_argument("--model", help="only entries derived from this model (as 'pie cache list' names it)")
    cl.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    cl.set_defaults(handler=_clean)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def _ago(t: float) -> str:
    days = (time.time() - t) / 86400
    return "today" if days < 1 else f"{days:,.0f} days ago"


def _list(args: argparse.Namespace) -> int:
    root = cache_dir()
    entries = cache_inventory.entries(root, cache_inventory.hub_model_names())
    if args.json:
        print(json.dumps([{"kind": e.kind, "model": e.model, "size": e.size, "last_used": e.last_used,
                           "paths": [str(p) for p in e.paths]} for e in entries], indent=2))
        return 0
    console = stdout_console()
    if not entries:
        console.print(f"the cache {root} is empty")
        return 0
    groups: dict[tuple[str, str], list[CacheEntry]] = {}
    for e in entries:
        groups.setdefault((e.kind, e.model), []).append(e)
    table = Table(title=f"Pie cache: {root}")
    for col in ("kind", "model", "entries", "size", "last used"):
        table.add_column(col, justify="right" if col in ("entries", "size") else "left")
    for kind in KINDS:
        rows = sorted(((m, g) for (k, m), g in groups.items() if k == kind), key=lambda r: -sum(e.size for e in r[1]))
        for model, group in rows:
            table.add_row(kind, model or "-", str(len(group)), _size(sum(e.size for e in group)),
                          _ago(max(e.last_used for e in group)))
        if len(rows) > 1:
            total = sum(e.size for _, g in rows for e in g)
            table.add_row(f"[bold]{kind}[/]", "[bold]all[/]", "", f"[bold]{_size(total)}[/]", "")
        if rows:
            table.add_section()
    table.add_row("[bold]total[/]", "", str(len(entries)), f"[bold]{_size(sum(e.size for e in entries))}[/]", "")
    console.print(table)
    console.print("free space with: pie cache clean [--kind KIND] [--older-than 30d] [--model NAME] [--dry-run]", markup=False)
    return 0


def _clean(args: argparse.Namespace) -> int:
    age = cache_inventory.parse_age(args.older_than) if args.older_than else None
    removed = cache_inventory.clean(args.kind, age, args.model, args.dry_run, names=cache_inventory.hub_model_names())
    for e in removed:
        print(f"{'would delete' if args.dry_run else 'deleted'} {e.kind} {e.model or '-'} {_size(e.size)} {e.path}")
    verb = "would free" if args.dry_run else "freed"
    print(f"{verb} {_size(sum(e.size for e in removed))} in {len(removed)} entries of {cache_dir()}")
    return 0
