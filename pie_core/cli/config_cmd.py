"""``pie config``: read and change ``~/.pie/config.toml`` (comments are preserved)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pie_core import config

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="show, get or set engine configuration")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = csub.add_parser("show", help="print the config file")
    show.set_defaults(handler=_show)
    get = csub.add_parser("get", help="print one value (dotted key, e.g. engine.default_model)")
    get.add_argument("key")
    get.set_defaults(handler=_get)
    set_ = csub.add_parser("set", help="set one value (TOML literal or plain string)")
    set_.add_argument("key")
    set_.add_argument("value")
    set_.set_defaults(handler=_set)


def _show(args: argparse.Namespace) -> int:
    print(f"# {config.config_path()}")
    print(config.load_config().as_string(), end="")
    return 0


def _get(args: argparse.Namespace) -> int:
    value = config.get(args.key)
    if value is None:
        print(f"error: {args.key} is not set", flush=True)
        return 1
    print(json.dumps(value) if not isinstance(value, str) else value)
    return 0


def _set(args: argparse.Namespace) -> int:
    config.set(args.key, config.parse_value(args.value))
    print(f"{args.key} = {args.value}  ({config.config_path()})")
    return 0
