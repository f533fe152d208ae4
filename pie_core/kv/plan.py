"""Where a pass's tokens go: the page list the backend sees, the slots written, the last page's fill."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pie_core.kv.lineage import Run

__all__ = ["ReplayStep", "WritePlan"]


class WritePlan:
    """Where a pass of ``n`` tokens goes: the page list the backend sees and the write slots."""

    __slots__ = ("page_ids", "write_slots", "last_page_len")

    def __init__(self, page_ids: np.ndarray, write_slots: np.ndarray, last_page_len: int) -> None:
        self.page_ids = page_ids
        self.write_slots = write_slots
        self.last_page_len = last_page_len


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One pass of a replay: the lineage's ``run`` (its mask and tag), its inputs and where they go."""

    run: Run
    token_ids: np.ndarray
    positions: np.ndarray
    plan: WritePlan
