"""Helpers for the attack tests: the two users, and a check that the victim is still served."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pie_core.client import connect
from pie_core.runtime.process import WorkerLimits

PROBE = Path(__file__).resolve().parents[1] / "server" / "inferlets" / "probe"
TOKENS = {"alice": "alice-token-123", "mallory": "mallory-token-666"}


@dataclass
class Served:
    server: Any  # PieServer
    url: str
    http: str
    tokens: dict[str, str]
    data_dir: Path


async def victim_is_served(s: Served, within_s: float = 10.0) -> float:
    """Alice installs the probe, runs it and gets her own name back within ``within_s`` seconds;
    returns how long it took."""
    start = time.monotonic()

    async def once() -> Any:
        async with await connect(s.url, s.tokens["alice"]) as alice:
            return await (await alice.launch(await alice.install(PROBE), {"mode": "user"})).wait()

    assert await asyncio.wait_for(once(), within_s) == "alice"
    return time.monotonic() - start


def write_program(folder: Path, main_py: str, *, name: str = "evil", parameters: str = "") -> Path:
    """An inferlet folder with ``main_py`` as its entry (``parameters`` is the TOML body of
    its ``[parameters]`` table)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pie.toml").write_text(f'[package]\nname = "{name}"\nversion = "1.0.0"\ndescription = "attack"\n\n'
                                     f"[parameters]\n{parameters}\n")
    (folder / "main.py").write_text(main_py)
    return folder


def limits_for_test(**overrides: Any) -> WorkerLimits:
    """Worker limits for attack tests: generous enough for honest inferlets on a busy CI."""
    return WorkerLimits(**{"wall_s": 30.0, "cpu_s": 30, "memory_mb": 1024, **overrides})
