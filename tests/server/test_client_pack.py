"""``pack_program`` gives the same bytes for the same folder, whenever it runs: the hash an
upload is checked and deduplicated by must not depend on the clock."""

from __future__ import annotations

import time
from pathlib import Path

from pie_core.client import pack_program

PROBE = Path(__file__).resolve().parent / "inferlets" / "probe"


def test_packing_the_same_folder_seconds_apart_gives_the_same_bytes(monkeypatch) -> None:
    first = pack_program(PROBE)
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)  # gzip stamps its header with time.time()
    assert pack_program(PROBE) == first
