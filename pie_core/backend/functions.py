"""A backend made of plain functions: tests and tools drive a worker without a real backend."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pie_core.errors import BackendError
from pie_core.hookspec import BatchOutput, CopyKind, ForwardBatch, hookimpl

__all__ = ["FunctionBackend"]


class FunctionBackend:
    """Implements ``pie_backend_forward`` with ``forward`` and ``pie_backend_copy_pages`` with
    ``copy_pages`` (a backend that cannot copy pages when None); nothing else.

    Use it as ``BackendWorker.of(FunctionBackend(forward))``.
    """

    def __init__(
        self,
        forward: Callable[[ForwardBatch], BatchOutput],
        copy_pages: Callable[[CopyKind, np.ndarray, np.ndarray], None] | None = None,
    ) -> None:
        self._forward = forward
        self._copy_pages = copy_pages

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        return self._forward(batch)

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        if self._copy_pages is None:
            raise BackendError("this backend cannot copy pages")
        self._copy_pages(kind, src, dst)
