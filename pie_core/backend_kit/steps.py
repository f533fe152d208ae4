"""One-time steps a backend takes while it loads a model (building kernels, packing weights),
said on screen: the CLI's loading bar listens (:func:`step_listener`) and shows each step as its
phase (a line when stderr is not a terminal); without a listener a step is logged at INFO.

Backends call :func:`announce_step` from any thread (the backend worker loads the model)."""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["announce_step", "step_listener"]

_log = logging.getLogger("pie.backend")
_lock = threading.Lock()
_listeners: list[Callable[[str], None]] = []


def announce_step(text: str) -> None:
    """Say that a one-time step begins or progresses (``"packing the weights: layer 3/24"``)."""
    with _lock:
        listener = _listeners[-1] if _listeners else None
    if listener is None:
        _log.info("%s", text)
    else:
        listener(text)


@contextmanager
def step_listener(listener: Callable[[str], None]) -> Iterator[None]:
    """Send every :func:`announce_step` inside the block to ``listener``."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)
