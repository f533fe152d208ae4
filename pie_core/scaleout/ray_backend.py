"""One replica's backend inside a Ray actor: the process (on any machine of the cluster) that
binds the backend by name, reads the model itself, and runs every call the engine sends."""

from __future__ import annotations

import dataclasses
import os
import socket

import numpy as np
import tomlkit

from pie_core import __version__
from pie_core.backend import BackendWorker
from pie_core.hookspec import BackendInfo, BackendOptions, BatchOutput, Capabilities, CopyKind, ForwardBatch
from pie_core.models.spec import ModelSpec
from pie_core.plugins import bind_backend

__all__ = ["BackendActor", "Loaded"]


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    """What a model load in the actor answers: the backend's capabilities, and the spec the
    actor's machine resolved the model's name to (the engine checks it is the one it resolved)."""

    caps: Capabilities
    spec: ModelSpec


class BackendActor:
    """The body of a replica's Ray actor (``ray.remote`` is applied where it is started, so this
    module imports without Ray). Its methods are :class:`~pie_core.backend.BackendCalls`', with
    ``load`` taking a model's name instead of its weights: no weight crosses the network.

    The backend lives in a :class:`~pie_core.backend.BackendWorker` here, so it sees every call
    on one thread whatever thread Ray runs the method on, and adapter ids are mapped onto the
    backend's slots here, as in a local replica. The actor runs with ``max_concurrency=1``:
    calls run one at a time, in the order the engine's worker sent them.

    Args:
        backend: The backend's entry-point name (:func:`pie_core.plugins.bind_backend`).
    """

    def __init__(self, backend: str) -> None:
        self._worker = BackendWorker(bind_backend(backend))

    def ready(self) -> tuple[str, str, int]:
        """Pie's version, the host name and the process id of this actor (it has started)."""
        return __version__, socket.gethostname(), os.getpid()

    def info(self) -> BackendInfo:
        return self._worker.call(lambda calls: calls.info())

    def load(self, model: str, config: str | None, options: BackendOptions) -> Loaded:
        """Resolve ``model`` as the engine's machine did (same name, and the engine's
        configuration text when given) and load it.

        Raises:
            Whatever :func:`~pie_core.models.registry.resolve_model` or the backend's load raises
            (a ``ValueError`` for an option or weight it cannot take).
        """
        from pie_core.models.registry import resolve_model

        source = resolve_model(model, tomlkit.parse(config) if config is not None else None)
        keep = not self.info().keeps_derived_weights  # as Engine._start_here decides
        weights = source.weights(keep=keep)
        options = dataclasses.replace(options, weights_key=source.cache_key)
        caps = self._worker.call(lambda calls: calls.load_model(source.spec, weights, options))
        return Loaded(caps, source.spec)

    def forward(self, batch: ForwardBatch) -> BatchOutput:
        return self._worker.call(lambda calls: calls.forward(batch))

    def copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        self._worker.call(lambda calls: calls.copy_pages(kind, src, dst))

    def adapter_create(self, adapter_id: int, rank: int, scaling: float) -> None:
        self._worker.call(lambda calls: calls.adapter_create(adapter_id, rank, scaling))

    def adapter_load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        self._worker.call(lambda calls: calls.adapter_load(adapter_id, tensors, scaling))

    def adapter_save(self, adapter_id: int) -> dict[str, np.ndarray]:
        return self._worker.call(lambda calls: calls.adapter_save(adapter_id))

    def adapter_destroy(self, adapter_id: int) -> None:
        self._worker.call(lambda calls: calls.adapter_destroy(adapter_id))

    def adapter_zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        self._worker.call(lambda calls: calls.adapter_zo(adapter_id, sigma, seeds, coefficients))
