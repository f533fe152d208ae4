"""Run the suite programmatically (what ``pie conformance`` does): pytest over ``conformance.cases``."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Sequence

__all__ = ["run_suite", "suite_args"]

_PLUGIN = "pie_conformance"


def suite_args(
    backend: str,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    page_size: int | None = None,
    archs: Sequence[str] = (),
    numerics: str = "auto",
    atol: float | None = None,
    rtol: float | None = None,
    report: str | None = None,
    select: str | None = None,
    verbose: bool = False,
    backend_options: Sequence[str] = (),
) -> list[str]:
    """The pytest command line that runs the suite with these settings.

    ``backend_options`` are ``KEY=VALUE`` strings for ``BackendOptions.extra`` of the backend
    under test (``--pie-backend-option``).
    """
    args = ["--pyargs", "conformance.cases", "-p", "no:cacheprovider", "--pie-backend", backend]
    args += ["--pie-device", device, "--pie-numerics", numerics]
    if dtype:
        args += ["--pie-dtype", dtype]
    if page_size:
        args += ["--pie-page-size", str(page_size)]
    for arch in archs:
        args += ["--pie-arch", arch]
    if atol is not None:
        args += ["--pie-atol", str(atol)]
    if rtol is not None:
        args += ["--pie-rtol", str(rtol)]
    for option in backend_options:
        args += ["--pie-backend-option", option]
    if report:
        args += ["--pie-report", report]
    if select:
        args += ["-k", select]
    args.append("-v" if verbose else "-q")
    return args


def run_suite(backend: str, **settings: object) -> int:
    """Run the conformance suite against ``backend``; returns pytest's exit code (0: all passed).

    A backend that does not import, bind or load is not an exception here: the suite reports it
    in one line with the table of cases not run, and returns 1.

    Args:
        backend: Entry-point name in ``pie.backends`` or a ``module:Factory`` import path.
        **settings: Keyword arguments of :func:`suite_args` (device, dtype, page_size, archs,
            numerics, atol, rtol, report, select, verbose, backend_options).

    Raises:
        NotFound: No backend of that name is installed.
        InvalidInput: A backend option is not ``KEY=VALUE``.
        RuntimeError: The suite's pytest plugin is not installed (reinstall pie-engine).
    """
    import pytest

    if not any(ep.name == _PLUGIN for ep in entry_points(group="pytest11")):
        raise RuntimeError(
            "the conformance pytest plugin is not registered; reinstall Pie "
            "(pip install -c constraints.txt -e .) so its pytest11 entry point exists"
        )
    from conformance.harness import require_installed
    from pie_core.cli.backend_args import parse_backend_options

    require_installed(backend)  # an unknown name fails here, listing the installed backends
    parse_backend_options(settings.get("backend_options", ()))  # type: ignore[arg-type]
    return int(pytest.main(suite_args(backend, **settings)))  # type: ignore[arg-type]
