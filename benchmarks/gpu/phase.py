"""Runs one phase in a child process of its own: ``python -m benchmarks.gpu.phase NAME SETTINGS RESULT``.

A phase is a function ``run(settings, record)`` (see :data:`PHASES`). Each runs alone in its
process so that what one does to the device (an illegal address poisons a CUDA context for good,
a hung kernel, a crash) ends that phase only, and so that the parent can stop it at its deadline
with what it recorded so far. An exception is recorded with its traceback and exits 1.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

from benchmarks.gpu.record import Record
from benchmarks.gpu.settings import Settings

__all__ = ["PHASES", "main"]

PHASES = {
    "environment": "benchmarks.gpu.environment:run",
    "models": "benchmarks.gpu.model_folder:run",
    "conformance": "benchmarks.gpu.conformance_runs:run",
    "exactness": "benchmarks.gpu.exactness:run",
    "throughput": "benchmarks.gpu.throughput:run",
    "profile": "benchmarks.gpu.profile:run",
}
"""Phase name -> ``module:function``, in the order the check runs them."""


def main(argv: list[str]) -> int:
    name, settings_path, result_path = argv
    record = Record(Path(result_path))
    try:
        module, _, func = PHASES[name].partition(":")
        getattr(importlib.import_module(module), func)(Settings.load(Path(settings_path)), record)
    except BaseException as exc:  # noqa: BLE001 - the parent reads the record, not our exit status alone
        record.put("error", f"{type(exc).__name__}: {exc}")
        record.put("traceback", traceback.format_exc()[-4000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
