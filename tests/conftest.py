"""Suite-wide rules. Under ``CI=true`` a missing test dependency fails the run instead of
skipping tests silently: every distribution of the ``test`` extra (pyproject.toml) must be
installed, and a test skipped by ``pytest.importorskip`` fails."""

from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib
from pathlib import Path

import pytest

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def test_extra_requirements() -> list[str]:
    """The distribution names of pyproject.toml's ``test`` extra."""
    extras = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    return [re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0] for req in extras["test"]]


test_extra_requirements.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def missing_test_requirements() -> list[str]:
    missing = []
    for name in test_extra_requirements():
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def pytest_sessionstart(session: pytest.Session) -> None:
    if _in_ci():
        missing = missing_test_requirements()
        if missing:
            raise pytest.UsageError(
                f"CI=true but test dependencies are not installed: {', '.join(missing)}; "
                "install them with: pip install -e '.[test]'"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _in_ci() and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if "could not import" in reason:  # pytest.importorskip's message
            report.outcome = "failed"
            report.longrepr = f"CI=true: {reason.removeprefix('Skipped: ')} (a test dependency is missing; pip install -e '.[test]')"


@pytest.fixture(scope="session")
def real_cpu_engine():
    """The NumPy backend on the real default model (float32, ~2.5 GB), loaded once for the whole
    run and shared by every folder's tests that need it (each left the page pool whole)."""
    import asyncio

    from pie_core.engine.engine import Engine

    engine = Engine("cpu")
    engine.load(None)
    yield engine
    asyncio.run(engine.close())


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """``PIE_TEST_RSS=FILE``: after each test, append its id and the run's resident and peak memory
    (MiB), to find which tests hold memory (the suite must fit CI's 24 GiB)."""
    path = os.environ.get("PIE_TEST_RSS")
    if path:
        import resource

        rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{rss}\t{peak}\t{nodeid}\n")
