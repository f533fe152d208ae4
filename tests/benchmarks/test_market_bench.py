"""benchmarks/market.py runs its three configurations end to end at a tiny size: the market
loses nobody, first-come (the emulated old behaviour) completes some and fails others, and pools
and credit are whole after each (the script asserts those itself)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_market_benchmark_compares_its_three_configurations(tmp_path: Path) -> None:
    out = tmp_path / "market.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/market.py", "--repeats", "1", "--generators", "4", "--max-tokens", "24",
         "--pages", "8", "--step-ms", "0", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert results["market"]["failed"] == 0 and results["market"]["completed"] == 4
    first = results["first-come"]
    assert first["completed"] >= 1 and first["failed"] >= 1, first  # it ran, and the pool was too small for all
    assert results["unlimited"]["failed"] == 0
