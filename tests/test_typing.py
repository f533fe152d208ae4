"""mypy passes over the files ``[tool.mypy]`` in pyproject.toml names (strict where it says so).

The cache sits in the checkout's git-ignored ``.mypy_cache``: a cold run reads numpy's and the
engine's imports (~40 s on 2 cores), a warm one takes a second or two.
"""

from __future__ import annotations

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is in the test extra (pip install -e .[test])")

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors_in_the_configured_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # mypy reads [tool.mypy] from ./pyproject.toml; its paths are relative to it
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary"])
    assert status == 0, f"mypy found errors (run `python -m mypy` in the checkout):\n{out}{err}"
