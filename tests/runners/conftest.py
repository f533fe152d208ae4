"""Fixtures of the cross-runner suite: one dummy engine, and every scenario run once per runner.

``runs.of(runner)`` starts a server with that runner's launcher on first use, runs every
scenario of :mod:`runner_scenarios` through it in order, closes it, and keeps the outcomes (and
whether every KV page was back in the pool afterwards) for the module's tests. The three
servers share one data directory, so paths the engine writes into messages (a user's scratch
directory) read the same in every runner.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # wasm_helpers: one wasm launcher per session

from runner_harness import Outcome, run_scenarios  # noqa: E402
from runner_scenarios import SCENARIOS  # noqa: E402

from pie_core.engine.engine import Engine  # noqa: E402
from pie_core.runtime.launcher import InProcessLauncher  # noqa: E402
from pie_core.runtime.process import ProcessLauncher, WorkerLimits  # noqa: E402


def launcher_for(runner: str) -> Any:
    if runner == "in-process":
        return InProcessLauncher()
    if runner == "process":
        return ProcessLauncher(WorkerLimits(wall_s=60, cpu_s=60, memory_mb=1024))
    if runner == "wasm":
        from wasm_helpers import shared_launcher

        return shared_launcher()
    raise ValueError(f"unknown runner {runner!r}")


class Runs:
    """Every scenario's outcome per runner, run on first use."""

    def __init__(self, engine: Engine, data_dir: Path) -> None:
        self.engine = engine
        self.data_dir = data_dir
        self._outcomes: dict[str, dict[str, Outcome]] = {}
        self.pools_whole: dict[str, bool] = {}

    def of(self, runner: str) -> dict[str, Outcome]:
        if runner not in self._outcomes:
            self._outcomes[runner] = run_scenarios(self.engine, runner, launcher_for(runner), SCENARIOS, self.data_dir)
            self.pools_whole[runner] = self.engine.pools_whole()
        return self._outcomes[runner]


@pytest.fixture(scope="session")
def engine() -> Engine:
    engine = Engine("dummy")
    engine.load(None)
    return engine


@pytest.fixture(scope="module")
def runs(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(engine, tmp_path_factory.mktemp("pie-runners"))
