"""Binary run-length encoding (BRLE), the wire form of attention and logit masks.

A BRLE is a list of run lengths over alternating values, the first run being ``False``
(it may be 0 long): ``[0, 3, 2]`` is ``[T, T, T, F, F]``. True means "attend" in an attention
mask and "allowed" in a logit mask.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pie_core.errors import InvalidInput

__all__ = ["decode", "encode", "pack_bits"]


def decode(runs: Sequence[int], length: int | None = None, what: str = "mask") -> np.ndarray:
    """Expand runs into a bool array.

    Args:
        runs: Run lengths, first run False.
        length: Expected total length; a mismatch raises.
        what: Name used in error messages.

    Raises:
        InvalidInput: Negative runs, or a total that differs from ``length``.
    """
    arr = np.asarray(runs, dtype=np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise InvalidInput(f"{what}: BRLE run lengths must be >= 0, got {arr.min()}")
    total = int(arr.sum())
    if length is not None and total != length:
        raise InvalidInput(f"{what}: BRLE covers {total} entries, expected {length}")
    values = (np.arange(arr.size) % 2).astype(bool)
    return np.repeat(values, arr)


def encode(mask: Sequence[bool] | np.ndarray) -> list[int]:
    """Compress a bool array into runs (first run False)."""
    m = np.asarray(mask, dtype=bool).reshape(-1)
    if not m.size:
        return []
    change = np.flatnonzero(m[1:] != m[:-1]) + 1
    bounds = np.concatenate(([0], change, [m.size]))
    runs = np.diff(bounds).tolist()
    return [0, *runs] if m[0] else runs


def pack_bits(mask: np.ndarray) -> np.ndarray:
    """Pack a bool vocabulary mask into the backend's uint8 bitmask (little bit order)."""
    return np.packbits(np.asarray(mask, dtype=bool), bitorder="little")
