"""``pie auth add|list|remove``: users allowed to connect to ``pie serve``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pie_core.cli.console import stdout_console
from rich.table import Table

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("auth", help="manage the users of 'pie serve'", description="Users and tokens for 'pie serve'. "
                       "Only a SHA-256 hash of each token is stored in the config file.")
    actions = p.add_subparsers(dest="auth_command", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="create a user (or replace its token) and print the token once")
    add.add_argument("name")
    add.set_defaults(handler=_add)
    ls = actions.add_parser("list", help="list users")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(handler=_list)
    rm = actions.add_parser("remove", help="delete a user and its token")
    rm.add_argument("name")
    rm.set_defaults(handler=_remove)


def _add(args: argparse.Namespace) -> int:
    from pie_core.server.auth import add_user

    token = add_user(args.name)
    console = stdout_console()
    console.print(f"user [bold]{args.name}[/]: token (shown once, keep it secret):")
    print(token)
    return 0


def _list(args: argparse.Namespace) -> int:
    from pie_core.server.auth import list_users, metrics_id

    users = list_users()
    if args.json:
        print(json.dumps([{"name": u.name, "created": u.created, "metrics_id": metrics_id(u)} for u in users]))
        return 0
    table = Table("user", "created", "token hash (prefix)", "label in /metrics")
    for u in users:
        table.add_row(u.name, u.created, u.token_sha256[:12], metrics_id(u))
    stdout_console().print(table if users else "no users; add one with 'pie auth add NAME'")
    return 0


def _remove(args: argparse.Namespace) -> int:
    from pie_core.server.auth import remove_user

    remove_user(args.name)
    print(f"removed user {args.name}")
    return 0
