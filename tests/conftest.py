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
