"""What a phase found, saved to disk after every change so that a phase killed at its deadline
(or crashed by the device) leaves everything it had measured.

A result is plain JSON: ``facts`` (name -> value), ``tables`` (title, columns, rows) and ``checks``
(name, ok, detail). :mod:`benchmarks.gpu.report` renders any of them without knowing the phase.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["Record", "Table"]


class Table:
    """A table of a record; every added row is saved at once."""

    def __init__(self, record: Record, entry: dict[str, Any]) -> None:
        self._record = record
        self._entry = entry

    @property
    def rows(self) -> list[list[Any]]:
        return self._entry["rows"]

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self._entry["columns"]):
            raise ValueError(f"table {self._entry['title']!r} has {len(self._entry['columns'])} columns, got {len(cells)} cells")
        self._entry["rows"].append([_plain(c) for c in cells])
        self._record.save()


class Record:
    """The result of one phase, mirrored to ``path`` (written atomically on every change)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.data: dict[str, Any] = {"facts": {}, "tables": [], "checks": []}

    def put(self, name: str, value: Any) -> None:
        """Record a fact (a number, a string, a small dict or list)."""
        self.data["facts"][name] = _plain(value)
        self.save()

    def table(self, title: str, columns: list[str]) -> Table:
        entry: dict[str, Any] = {"title": title, "columns": list(columns), "rows": []}
        self.data["tables"].append(entry)
        self.save()
        return Table(self, entry)

    def check(self, name: str, ok: bool | None, detail: str) -> None:
        """A verdict: ok True (met), False (missed), None (not decidable here, e.g. a goal on a CPU)."""
        self.data["checks"].append({"name": name, "ok": None if ok is None else bool(ok), "detail": str(detail)})
        self.save()

    def stopped(self, what: str) -> None:
        """Note work left undone for lack of time: the phase then counts as stopped, not ok."""
        self.data["facts"].setdefault("stopped", []).append(what)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def _plain(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python numbers, floats rounded to 4 significant digits."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
