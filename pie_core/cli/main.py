"""The ``pie`` command."""

from __future__ import annotations

import argparse
import sys

from pie_core import __version__
from pie_core.errors import PieError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from pie_core.cli import auth, backends, cache, config_cmd, conformance, examples, models, run, serve

    parser = argparse.ArgumentParser(prog="pie", description="Pie: a programmable LLM serving engine.")
    parser.add_argument("--version", action="version", version=f"pie {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.register(sub)
    examples.register(sub)
    backends.register(sub)
    models.register(sub)
    cache.register(sub)
    config_cmd.register(sub)
    conformance.register(sub)
    serve.register(sub)
    auth.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pie`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    trailing: list[str] = []
    if "--" in argv:  # everything after '--' is the inferlet's input
        cut = argv.index("--")
        argv, trailing = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if args.command == "run" and not trailing:  # the inferlet's parameters without the '--' before them
            print(f"pie run: error: unrecognized arguments: {' '.join(unknown)}; inferlet parameters go after '--': "
                  f"pie run {args.target} [options] -- {' '.join(unknown)}", file=sys.stderr)
            return 2
        parser.parse_args(argv)  # argparse's own error (usage, exit 2)
    args.trailing = trailing
    try:
        return int(args.handler(args) or 0)
    except PieError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
