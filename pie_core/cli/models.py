"""``pie model list``, ``info``, ``pull`` and ``rm``: models by name, on disk."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from pie_core.cli.console import stdout_console
from rich.table import Table

from pie_core import cache_inventory
from pie_core.errors import InvalidInput
from pie_core.models import hub
from pie_core.models.default_model import EMBEDDED_MODELS
from pie_core.models.registry import list_models, model_info

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("model", help="list and inspect models")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="SUBCOMMAND")
    ls = msub.add_parser("list", help="models: built in, from config, and in the Hugging Face cache, with sizes")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(handler=_list)
    info = msub.add_parser("info", help="architecture, tokenizer and file facts of one model")
    info.add_argument("name", nargs="?", help="model name (default: the configured default)")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(handler=_info)
    pull = msub.add_parser("pull", help="download a model from the Hugging Face Hub into its local cache",
                           description="Download a Hugging Face repo (config.json + *.safetensors, or one GGUF file) "
                           "into the Hugging Face cache; then --model ID uses it. Offline (HF_HUB_OFFLINE=1) it only "
                           "checks the cache.")
    pull.add_argument("repo_id", metavar="ID", help="a Hugging Face repo id, e.g. Qwen/Qwen2.5-0.5B-Instruct")
    pull.add_argument("--file", metavar="NAME.gguf", help="one GGUF file of the repo (needed when it has several)")
    pull.set_defaults(handler=_pull)
    rm = msub.add_parser("rm", help="delete a Hugging Face model from the local cache")
    rm.add_argument("repo_id", metavar="ID", help="a Hugging Face repo id in the cache (see 'pie model list')")
    rm.set_defaults(handler=_rm)


def _size(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _list(args: argparse.Namespace) -> int:
    rows = list_models()
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    table = Table(title="Models")
    for col in ("name", "arch", "format", "size", "from", "status", "path"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for r in rows:
        name = f"[bold]{r.name}[/] (default)" if r.default else r.name
        status = "[green]available[/]" if r.available else f"[yellow]{r.note or 'not installed'}[/]"
        table.add_row(name, r.arch or "-", r.format or "-", _size(r.size), r.origin, status, r.path or "-")
    console = stdout_console()
    console.print(table)
    console.print(f"Hugging Face cache: {hub.hub_cache_dir()} · what Pie derives from models: pie cache list")
    return 0


def _pull(args: argparse.Namespace) -> int:
    found = hub.pull(args.repo_id, args.file)
    print(f"{found.name}: {_size(found.size)} {found.format} at {found.path}")
    print(f"use it with: pie run text-completion --model {found.name}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    if args.repo_id in EMBEDDED_MODELS:
        raise InvalidInput(f"{args.repo_id} is built in: 'pie cache clean --kind models' frees its assembled copy; "
                           "pip uninstall its packages to remove it")
    names = cache_inventory.hub_model_names()  # before the files go: derived entries are named through them
    _, freed = hub.remove(args.repo_id)
    print(f"removed {args.repo_id} from the Hugging Face cache ({_size(freed)} freed)")
    repo = args.repo_id.lower()
    derived = [e for e in cache_inventory.entries(names=names) if e.model.split(":")[0].lower() == repo]
    if derived:
        cache_inventory.delete(derived)
        print(f"and what Pie derived from it: {len(derived)} cache entries, {_size(sum(e.size for e in derived))}")
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
