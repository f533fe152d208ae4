"""Declared numerical tolerances: how far a backend's outputs may drift from the float64 oracle.

A value ``a`` matches the reference value ``e`` when ``|a - e| <= atol + rtol * |e|`` (the rule
of ``numpy.isclose``). The table is keyed by the ``dtype`` a backend reports in its
capabilities; the tiny models of the suite have logits of magnitude ~10, so the half-precision
rows allow a few units in the last place of each layer's accumulation. Probabilities and
log-probabilities computed from the backend's *own* logits use the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Tolerance", "TOLERANCES", "tolerance_for"]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|``."""

    atol: float
    rtol: float

    def bad(self, actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
        """Bool mask of entries out of tolerance; equal infinities (masked logits) are fine."""
        a = np.asarray(actual, dtype=np.float64)
        e = np.asarray(expected, dtype=np.float64)
        same_inf = np.isinf(a) & np.isinf(e) & (np.sign(a) == np.sign(e))
        with np.errstate(invalid="ignore"):
            far = ~(np.abs(a - e) <= self.atol + self.rtol * np.abs(e))
        return far & ~same_inf

    def __str__(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=1e-3, rtol=1e-3),
    "float16": Tolerance(atol=3e-2, rtol=2e-2),
    "bfloat16": Tolerance(atol=3e-1, rtol=5e-2),
}
"""Tolerance per compute dtype (``Capabilities.dtype``). The bfloat16 row admits the oracle rounded
where a bfloat16 backend must (``Oracle(..., rounding="bfloat16")``: it needs atol up to ~0.19
beside rtol 0.05 on the suite's models) with 1.5x room, and no more than 3x
(``tests/conformance/test_tolerances.py``)."""


def tolerance_for(dtype: str, atol: float | None = None, rtol: float | None = None) -> Tolerance:
    """The declared tolerance of ``dtype``, with either bound overridden when given.

    Raises:
        ValueError: ``dtype`` has no declared tolerance and no override was given.
    """
    base = TOLERANCES.get(dtype)
    if base is None:
        if atol is None or rtol is None:
            known = ", ".join(sorted(TOLERANCES))
            raise ValueError(
                f"no declared tolerance for dtype {dtype!r} (known: {known}); "
                "pass --pie-atol and --pie-rtol to set one"
            )
        return Tolerance(atol, rtol)
    return Tolerance(base.atol if atol is None else atol, base.rtol if rtol is None else rtol)
