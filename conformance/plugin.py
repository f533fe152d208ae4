"""pytest plugin of the conformance suite (registered under ``pytest11`` as ``pie_conformance``).

It is loaded by every pytest run in an environment where Pie is installed, so it only adds
options and fixtures; the report is attached only when ``--pie-backend`` is given. Run the
suite with::

    pytest --pyargs conformance --pie-backend NAME [--pie-device D] [--pie-report PATH]

Options: ``--pie-backend`` (entry-point name or ``module:Factory``), ``--pie-device``,
``--pie-dtype``, ``--pie-page-size``, ``--pie-arch`` (repeatable), ``--pie-numerics``
(auto/on/off), ``--pie-atol``/``--pie-rtol``, ``--pie-backend-option KEY=VALUE`` (repeatable,
``BackendOptions.extra`` of the backend under test) and ``--pie-report`` (JSON path).

The backend is bound and its first tiny model loaded once, when the session is configured. If
that fails, no case runs: the report names the backend and the cause in one line and counts
every case as failed ("not run"), and the exit code is 1.

Fixtures: ``pie_conformance`` (the session's :class:`~conformance.harness.Harness`) and
``pie_arch`` (parametrised over the selected architectures).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conformance.harness import Harness
    from conformance.report import SuiteReport

__all__ = ["pie_conformance"]

_HARNESS = pytest.StashKey["Harness"]()
_ARCHS = ("qwen2", "llama", "qwen3", "gemma3")  # pie_core.models.spec.ARCHITECTURES, not imported
# here so that loading the plugin into unrelated pytest runs imports nothing of Pie's


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pie-conformance", "Pie backend conformance suite (pytest --pyargs conformance)")
    group.addoption("--pie-backend", metavar="NAME", help="backend to check: entry-point name or module:Factory")
    group.addoption("--pie-device", metavar="DEVICE", default="cpu", help="device the backend runs on (default cpu)")
    group.addoption("--pie-dtype", metavar="DTYPE", default=None, help="dtype to ask the backend for")
    group.addoption("--pie-page-size", metavar="N", type=int, default=16, help="KV page size (default 16)")
    group.addoption(
        "--pie-arch", metavar="ARCH", action="append", choices=_ARCHS,
        help="architecture of the tiny models (repeatable; default all)",
    )
    group.addoption(
        "--pie-numerics", choices=("auto", "on", "off"), default="auto",
        help="compare against the float64 oracle (auto: unless the backend is the weightless dummy)",
    )
    group.addoption("--pie-atol", type=float, default=None, help="override the dtype's absolute tolerance")
    group.addoption("--pie-rtol", type=float, default=None, help="override the dtype's relative tolerance")
    group.addoption(
        "--pie-backend-option", metavar="KEY=VALUE", action="append", default=[],
        help="BackendOptions.extra of the backend under test (repeatable; "
        "true/false and integers are converted)",
    )
    group.addoption("--pie-report", metavar="PATH", default=None, help="also write the report as JSON")


def pytest_configure(config: pytest.Config) -> None:
    backend = config.getoption("--pie-backend", default=None)
    if not backend:
        return
    from conformance.harness import Harness, SuiteOptions, require_installed
    from pie_core.cli.backend_args import parse_backend_options

    try:
        require_installed(backend)
    except LookupError as exc:
        raise pytest.UsageError(f"--pie-backend {backend}: {exc}") from exc
    try:
        options = SuiteOptions(
            backend=backend,
            device=config.getoption("--pie-device"),
            dtype=config.getoption("--pie-dtype"),
            page_size=config.getoption("--pie-page-size"),
            archs=tuple(config.getoption("--pie-arch") or _ARCHS),
            numerics=config.getoption("--pie-numerics"),
            atol=config.getoption("--pie-atol"),
            rtol=config.getoption("--pie-rtol"),
            extra=parse_backend_options(config.getoption("--pie-backend-option"), flag="--pie-backend-option"),
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    harness = Harness(options)
    harness.check()
    config.stash[_HARNESS] = harness
    config.pluginmanager.register(_Reporter(config, harness), "pie-conformance-reporter")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pie_arch" in metafunc.fixturenames:
        archs = metafunc.config.getoption("--pie-arch") or list(_ARCHS)
        metafunc.parametrize("pie_arch", archs)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--pie-backend", default=None):
        return
    if any("pie_conformance" in getattr(item, "fixturenames", ()) for item in items):
        raise pytest.UsageError(
            "the conformance suite needs a backend: pytest --pyargs conformance --pie-backend NAME "
            "(see `pie backends` for the installed ones)"
        )


@pytest.fixture(scope="session")
def pie_conformance(request: pytest.FixtureRequest) -> Harness:
    """The harness of the backend under test (``--pie-backend``), made when the session was configured."""
    return request.config.stash[_HARNESS]


def _surface(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    surface = getattr(module, "SURFACE", None)
    if surface:
        return str(surface)
    name = getattr(module, "__name__", "other").rsplit(".", 1)[-1]
    return name.removeprefix("test_")


def _reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(longrepr or "")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else report.outcome


class _Reporter:
    """Collects outcomes by surface and prints/writes the report at the end of the session."""

    def __init__(self, config: pytest.Config, harness: Harness) -> None:
        from conformance.report import SuiteReport

        self.config = config
        self.harness = harness
        self.report: SuiteReport = SuiteReport(backend=harness.name)
        self.surfaces: dict[str, str] = {}

    @pytest.hookimpl(trylast=True)  # after -k and -m have deselected
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if "pie_conformance" in getattr(item, "fixturenames", ()):
                self.surfaces[item.nodeid] = _surface(item)
        if self.harness.error is None:
            return
        for item in items:  # every case would fail on the same error: count them, run none
            if item.nodeid in self.surfaces:
                self.report.not_run(item.nodeid, self.surfaces[item.nodeid], "the backend did not load (error above)")
        items[:] = [item for item in items if item.nodeid not in self.surfaces]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        surface = self.surfaces.get(report.nodeid)
        if surface is None:
            return
        reason = "" if report.passed else _reason(report)
        self.report.record(report.nodeid, surface, report.when, report.outcome, reason, report.duration)

    def _finish(self) -> SuiteReport:
        if not self.report.header:
            self.report.header = self.harness.describe()
        return self.report

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.harness.error is not None:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        path = self.config.getoption("--pie-report")
        if path:
            self._finish().write_json(path)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.report.cases and self.harness.error is None:
            return
        text = self._finish().render(
            width=max(80, self.config.get_terminal_writer().fullwidth), color=terminalreporter.hasmarkup
        )
        terminalreporter.write_line("")
        terminalreporter.write(text)
