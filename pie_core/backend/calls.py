"""Typed calls into a bound backend, usable only on its worker's thread."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable

import numpy as np
import pluggy

from pie_core.backend.adapter_slots import AdapterSlots, SlotCalls
from pie_core.errors import BackendError
from pie_core.hookspec import BackendInfo, BackendOptions, BatchOutput, Capabilities, CopyKind, ForwardBatch
from pie_core.models.spec import ModelSpec

__all__ = ["BackendCalls"]


class BackendCalls:
    """One method per backend hook the engine uses, each a plain call of that hook.

    Only a :class:`~pie_core.backend.worker.BackendWorker` makes one, and hands it to the work it
    runs on its thread. Every method checks that it runs on that thread, so a backend sees all of
    its calls on one thread (see :func:`~pie_core.backend.worker.backend_thread` for why) even if
    the object escapes its operation.

    Adapter ids are the engine's: once a model is loaded, :class:`AdapterSlots` maps them onto
    the backend's ``max_adapters`` slots, parking idle adapters on the host (the adapter methods
    and :meth:`forward` translate).

    Raises (every method):
        RuntimeError: Called on any other thread than the worker's.
    """

    __slots__ = ("_hook", "_thread", "adapters")

    def __init__(self, pm: pluggy.PluginManager, thread: int) -> None:
        self._hook = pm.hook
        self._thread = thread
        self.adapters: AdapterSlots | None = None  # set by load_model

    def _check(self, what: str) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                f"backend call {what} on thread {threading.current_thread().name!r}: a backend is called only "
                "on its worker's thread; go through BackendWorker (enqueue_op, call)"
            )

    def info(self) -> BackendInfo:
        """``pie_backend_info``: name, version, contract version, features."""
        self._check("info")
        info: BackendInfo = self._hook.pie_backend_info()
        return info

    def load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        """``pie_backend_load_model``: load the weights; the backend's capabilities for them."""
        self._check("load_model")
        caps: Capabilities = self._hook.pie_backend_load_model(spec=spec, weights=weights, options=options)
        hook = self._hook
        self.adapters = AdapterSlots(caps.max_adapters, SlotCalls(
            create=lambda slot, rank, scaling: hook.pie_backend_adapter_create(adapter_id=slot, rank=rank, scaling=scaling),
            load=lambda slot, tensors, scaling: hook.pie_backend_adapter_load(adapter_id=slot, tensors=tensors, scaling=scaling),
            save=lambda slot: hook.pie_backend_adapter_save(adapter_id=slot),
            destroy=lambda slot: hook.pie_backend_adapter_destroy(adapter_id=slot),
            zo=lambda slot, sigma, seeds, coefficients: hook.pie_backend_adapter_zo(
                adapter_id=slot, sigma=sigma, seeds=seeds, coefficients=coefficients),
        ))
        return caps

    def forward(self, batch: ForwardBatch) -> BatchOutput:
        """``pie_backend_forward``: run one batch."""
        self._check("forward")
        if self.adapters is not None and (batch.adapter_ids >= 0).any():
            batch = dataclasses.replace(batch, adapter_ids=self.adapters.batch(batch.adapter_ids))
        out: BatchOutput = self._hook.pie_backend_forward(batch=batch)
        return out

    def copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """``pie_backend_copy_pages``: copy pages ``src[i]`` to ``dst[i]``.

        Raises:
            BackendError: The backend implements no page copy.
        """
        self._check("copy_pages")
        if not self._hook.pie_backend_copy_pages.get_hookimpls():
            raise BackendError("this backend cannot copy pages")
        self._hook.pie_backend_copy_pages(kind=kind, src=src, dst=dst)

    def adapter_create(self, adapter_id: int, rank: int, scaling: float) -> None:
        """``pie_backend_adapter_create``: a zero adapter of ``rank`` under ``adapter_id``."""
        self._check("adapter_create")
        self._slots().create(adapter_id, rank, scaling)

    def adapter_load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        """``pie_backend_adapter_load``: replace the adapter's mean weights."""
        self._check("adapter_load")
        self._slots().load(adapter_id, tensors, scaling)

    def adapter_save(self, adapter_id: int) -> dict[str, np.ndarray]:
        """``pie_backend_adapter_save``: the adapter's mean weights."""
        self._check("adapter_save")
        tensors: dict[str, np.ndarray] = self._slots().save(adapter_id)
        return tensors

    def adapter_destroy(self, adapter_id: int) -> None:
        """``pie_backend_adapter_destroy``: free the adapter's id and weights."""
        self._check("adapter_destroy")
        self._slots().destroy(adapter_id)

    def adapter_zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        """``pie_backend_adapter_zo``: move the mean by ``sum_i coefficients[i] eps(seeds[i])``, set sigma."""
        self._check("adapter_zo")
        self._slots().zo(adapter_id, sigma, seeds, coefficients)

    def close(self) -> None:
        """Release what these calls reach, on any thread, once the worker's thread stopped:
        nothing for a backend in this process (it lives as long as its plugin manager); a proxy
        to one in another process stops it there."""

    def _slots(self) -> AdapterSlots:
        if self.adapters is None:
            raise BackendError("no model is loaded: adapters come after load_model")
        return self.adapters
