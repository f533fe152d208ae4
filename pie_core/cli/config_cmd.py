"""``pie config``: read and change ``~/.pie/config.toml`` (comments are preserved)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pie_core import config
from pie_core.cli.config_schema import check_setting, describe, is_known, unknown_key_message
from pie_core.errors import InvalidInput

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="show, get or set engine configuration")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = csub.add_parser("show", help="print the config file")
    show.set_defaults(handler=_show)
    get = csub.add_parser("get", help="print one value (dotted key, e.g. engine.default_model)")
    get.add_argument("key")
    get.set_defaults(handler=_get)
    set_ = csub.add_parser(
        "set",
        help="set one value (checked: unknown keys and values of the wrong type are refused)",
        description="Set one key of config.toml. VALUE is a TOML literal or plain text; it is checked "
        "against the key's type and range before the file is written.",
        epilog="keys:\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    set_.add_argument("key")
    set_.add_argument("value")
    set_.set_defaults(handler=_set)


def _show(args: argparse.Namespace) -> int:
    path = config.config_path()
    if path.is_file():
        print(f"# {path}")
    else:
        print(f"# No config file yet: these are the defaults. 'pie config set KEY VALUE' would create {path}")
    print(config.load_config().as_string(), end="")
    return 0


def _get(args: argparse.Namespace) -> int:
    doc = config.load_config()
    value = config.get(args.key, doc)
    if value is None:
        if not is_known(args.key):
            raise InvalidInput(unknown_key_message(args.key))
        raise InvalidInput(f"{args.key} is not set; set it with 'pie config set {args.key} VALUE'")
    print(json.dumps(value) if not isinstance(value, str) else value)
    return 0


def _set(args: argparse.Namespace) -> int:
    doc = config.load_config()
    value = check_setting(args.key, args.value, doc)
    config.set(args.key, value, config=doc)
    path = config.save_config(doc)
    print(f"{args.key} = {json.dumps(value)}  ({path})")
    return 0
