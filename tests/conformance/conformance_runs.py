"""Run the conformance suite in a child process (as a backend author would) and read its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SuiteRun:
    returncode: int
    output: str
    report: dict[str, Any]

    def outcomes(self, outcome: str) -> list[str]:
        return [c["case"] for c in self.report["cases"] if c["outcome"] == outcome]

    def surface(self, name: str) -> dict[str, int]:
        return self.report["surfaces"].get(name, {"passed": 0, "failed": 0, "not_supported": 0})


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    return env


def run_pie_conformance(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pie conformance ARGS`` in ``tmp_path``, with this folder on PYTHONPATH (as :func:`run_suite`)."""
    cmd = [sys.executable, "-m", "pie_core.cli.main", "conformance", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)


def run_suite(tmp_path: Path, backend: str, *extra: str, python: str = sys.executable) -> SuiteRun:
    """``python -m pytest --pyargs conformance --pie-backend BACKEND`` in ``tmp_path``.

    ``tmp_path`` as the working directory keeps the repository's pytest settings out of it;
    this folder is on PYTHONPATH so ``conformance_mutants:Class`` resolves.
    """
    report = tmp_path / "report.json"
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "conformance",
           "--pie-backend", backend, "--pie-report", str(report), *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert report.exists(), f"the suite wrote no report (exit {proc.returncode}):\n{output[-3000:]}"
    return SuiteRun(proc.returncode, output, json.loads(report.read_text()))
