"""``pie conformance``: run the backend conformance suite against an installed backend."""

from __future__ import annotations

import argparse
from typing import Any

from pie_core.errors import InvalidInput
from pie_core.models.spec import ARCHITECTURES

__all__ = ["register"]



def register(sub: Any) -> None:
    p = sub.add_parser(
        "conformance",
        help="check a backend against the hook spec (golden batches vs a float64 oracle)",
        description=(
            "Run Pie's conformance suite against a backend: every surface of the hook spec, on tiny "
            "random models of each architecture, compared with the suite's float64 NumPy oracle (no backend "
            "is the reference). Cases "
            "for features the backend does not declare are reported as 'not supported'. A backend "
            "that does not import, bind or load is reported in one line, with no case run. Exits 0 "
            "when nothing failed."
        ),
    )
    p.add_argument(
        "--backend", required=True, metavar="NAME", help="entry-point name (see `pie backends`) or module:Factory"
    )
    p.add_argument("--device", default="cpu", help="device to load the backend on (default cpu)")
    p.add_argument("--dtype", default=None, help="dtype to ask the backend for (default: float32)")
    p.add_argument("--page-size", type=int, default=None, metavar="N", help="KV page size (default 16)")
    p.add_argument(
        "--arch", action="append", choices=ARCHITECTURES, help="architecture of the tiny models (repeatable; default all)"
    )
    p.add_argument(
        "--numerics", choices=("auto", "on", "off"), default="auto",
        help="compare logits with the float64 oracle (auto: on unless the backend is the weightless dummy)",
    )
    p.add_argument("--atol", type=float, default=None, help="override the dtype's declared absolute tolerance")
    p.add_argument("--rtol", type=float, default=None, help="override the dtype's declared relative tolerance")
    p.add_argument(
        "--backend-option", action="append", default=[], metavar="KEY=VALUE",
        help="BackendOptions.extra of the backend under test, e.g. provider=cpu "
        "(repeatable; true/false and integers are converted)",
    )
    p.add_argument(
        "--report", nargs=2, metavar=("FORMAT", "PATH"), default=None,
        help="also write the report: --report json PATH",
    )
    p.add_argument("-k", dest="select", default=None, metavar="EXPR", help="only cases matching a pytest -k expression")
    p.add_argument("-v", "--verbose", action="store_true", help="list every case")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from conformance.runner import run_suite

    report = None
    if args.report is not None:
        fmt, report = args.report
        if fmt != "json":
            raise InvalidInput(f"--report supports the format 'json', not {fmt!r}: use --report json PATH")
    return run_suite(
        args.backend,
        device=args.device,
        dtype=args.dtype,
        page_size=args.page_size,
        archs=args.arch or (),
        numerics=args.numerics,
        atol=args.atol,
        rtol=args.rtol,
        report=report,
        select=args.select,
        verbose=args.verbose,
        backend_options=args.backend_option,
    )
