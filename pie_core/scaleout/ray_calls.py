"""The engine's side of a replica on Ray: :class:`RayCalls`, the typed backend calls sent to the
replica's actor, and :func:`start_ray_replicas`, which starts a model's actors and loads the
model in each.

Each call is ``ray.get(actor.method.remote(...))`` made on the replica's
:class:`~pie_core.backend.BackendWorker` thread, so the event loop never waits on the network and
the worker, the batcher, page copies and adapter operations are the ones a local replica uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from pie_core import __version__
from pie_core.backend import BackendCalls, BackendWorker
from pie_core.errors import BackendError, InvalidInput
from pie_core.hookspec import BackendInfo, BackendOptions, BatchOutput, Capabilities, CopyKind, ForwardBatch
from pie_core.models.spec import ModelSpec
from pie_core.scaleout.ray_backend import BackendActor, Loaded
from pie_core.scaleout.ray_cluster import import_ray

__all__ = ["RayCalls", "START_TIMEOUT_S", "actor_resources", "start_ray_replicas"]

START_TIMEOUT_S = 120.0
"""How long an actor may take to be scheduled and start (Python and the backend's imports)."""


def actor_resources(device: str) -> dict[str, float]:
    """What a replica's actor asks Ray for: one GPU on a CUDA device, else one CPU."""
    return {"num_gpus": 1} if device.startswith("cuda") else {"num_cpus": 1}


class RayCalls(BackendCalls):
    """:class:`BackendCalls` whose methods run on a replica's Ray actor
    (:class:`~pie_core.scaleout.ray_backend.BackendActor`). Like the local calls, each refuses to
    run off its worker's thread; adapter ids are mapped onto slots in the actor.

    Raises (every method):
        BackendError: The actor is gone (killed, its process or machine died): one line that
            names the replica; the batcher then marks the replica dead.
        Whatever the backend raised in the actor, as that exception (not Ray's wrapper).
    """

    __slots__ = ("_actor", "_what")

    def __init__(self, actor: Any, thread: int, what: str) -> None:
        self._thread = thread
        self.adapters = None
        self._actor = actor
        self._what = what

    @property
    def actor(self) -> Any:
        """The replica's actor handle (:class:`~pie_core.scaleout.ray_backend.BackendActor`)."""
        return self._actor

    def _get(self, ref: Any, timeout: float | None = None) -> Any:
        ray = import_ray()
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError as exc:
            raise BackendError(_gone(self._what, exc)) from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, Exception):
                raise cause from None
            raise

    def ready(self, timeout: float) -> tuple[str, str, int]:
        """Wait until the actor has started: Pie's version, the host and the process id there.

        Raises:
            BackendError: It did not start in ``timeout`` seconds, or failed to (one line).
        """
        self._check("ready")
        ray = import_ray()
        try:
            return cast(tuple[str, str, int], self._get(self._actor.ready.remote(), timeout=timeout))
        except ray.exceptions.GetTimeoutError:
            raise BackendError(f"{self._what}: its Ray actor did not start in {timeout:.0f} s; the cluster has no "
                               "free GPU or CPU for it ('ray status' shows what is free): add a node or serve "
                               "fewer replicas") from None

    def info(self) -> BackendInfo:
        self._check("info")
        return cast(BackendInfo, self._get(self._actor.info.remote()))

    def load_model(self, spec: ModelSpec, weights: Any, options: BackendOptions) -> Capabilities:
        """Refused: a replica on Ray reads its model itself (:meth:`load_named`)."""
        raise BackendError("a replica on Ray loads its model by name (RayCalls.load_named), never from weights sent to it")

    def load_named(self, model: str, config: str | None, options: BackendOptions, spec: ModelSpec) -> Capabilities:
        """Have the actor resolve ``model`` and load it; ``spec`` is what the engine resolved.

        Raises:
            InvalidInput: The actor's machine resolved the name to another model.
        """
        self._check("load_named")
        loaded = cast(Loaded, self._get(self._actor.load.remote(model, config, options)))
        if loaded.spec != spec:
            raise InvalidInput(f"{self._what}: model {model!r} is a different model on the actor's machine "
                               "(another file or version under that name); give every machine the same one")
        return loaded.caps

    def forward(self, batch: ForwardBatch) -> BatchOutput:
        self._check("forward")
        return cast(BatchOutput, self._get(self._actor.forward.remote(batch)))

    def copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        self._check("copy_pages")
        self._get(self._actor.copy_pages.remote(kind, src, dst))

    def adapter_create(self, adapter_id: int, rank: int, scaling: float) -> None:
        self._check("adapter_create")
        self._get(self._actor.adapter_create.remote(adapter_id, rank, scaling))

    def adapter_load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        self._check("adapter_load")
        self._get(self._actor.adapter_load.remote(adapter_id, tensors, scaling))

    def adapter_save(self, adapter_id: int) -> dict[str, np.ndarray]:
        self._check("adapter_save")
        return cast(dict[str, np.ndarray], self._get(self._actor.adapter_save.remote(adapter_id)))

    def adapter_destroy(self, adapter_id: int) -> None:
        self._check("adapter_destroy")
        self._get(self._actor.adapter_destroy.remote(adapter_id))

    def adapter_zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        self._check("adapter_zo")
        self._get(self._actor.adapter_zo.remote(adapter_id, sigma, seeds, coefficients))

    def close(self) -> None:
        """Kill the actor (its backend and the model it loaded go with its process)."""
        ray = import_ray()
        if ray.is_initialized():
            ray.kill(self._actor)


def start_ray_replicas(backend: str, whats: Sequence[str], model: str, config: str | None, options: BackendOptions,
                       spec: ModelSpec, timeout: float = START_TIMEOUT_S) -> list[tuple[BackendWorker, Capabilities]]:
    """Start one actor per replica on the connected Ray cluster and load ``model`` in each, all at
    once (each actor reads the model on its own machine, so N loads take the time of one).

    Args:
        backend: The backend's name, bound in each actor.
        whats: The replicas, for messages (``replica 1 of 'qwen'``), one per actor.
        model: The model's name, resolved in each actor as the engine resolved it.
        config: The engine's configuration as TOML text (None: each actor's machine's own).
        options: The backend options; a CUDA device is each actor's one GPU (``cuda``).
        spec: The spec the engine resolved ``model`` to.
        timeout: Seconds an actor may take to be scheduled and start.

    Returns:
        Per replica, a worker whose calls reach its actor and the loaded backend's capabilities.

    Raises:
        BackendError: An actor did not start in time (no free GPU or CPU in the cluster), failed
            to, or runs another version of Pie (the first replica's error; every actor is
            stopped).
        InvalidInput: The backend refused an option or a weight, or the name is another model there.
    """
    ray = import_ray()
    if options.device.startswith("cuda"):
        options = dataclasses.replace(options, device="cuda")  # Ray gives each actor one GPU, as cuda:0
    remote = ray.remote(BackendActor).options(max_concurrency=1, **actor_resources(options.device))
    workers: list[BackendWorker] = []
    try:
        for what in whats:
            actor = remote.remote(backend)  # scheduled now; started in parallel
            workers.append(BackendWorker(None, calls=_calls_to(actor, what)))
        with ThreadPoolExecutor(max_workers=max(1, len(workers)), thread_name_prefix="pie-ray-start") as pool:
            loads = [pool.submit(_load, worker, what, backend, model, config, options, spec, timeout)
                     for worker, what in zip(workers, whats)]
            return [(worker, load.result()) for worker, load in zip(workers, loads)]
    except BaseException:
        for worker in workers:
            worker.close(wait=False)
        raise


def _calls_to(actor: Any, what: str) -> Callable[[int], BackendCalls]:
    return lambda thread: RayCalls(actor, thread, what)


def _load(worker: BackendWorker, what: str, backend: str, model: str, config: str | None, options: BackendOptions,
          spec: ModelSpec, timeout: float) -> Capabilities:
    """Wait for a replica's actor to start, check its version, load the model there."""
    version, host, pid = worker.call(lambda calls: cast(RayCalls, calls).ready(timeout))
    if version != __version__:
        raise BackendError(f"{what}: the Ray node {host} runs pie-engine {version}, this engine {__version__}; "
                           "install the same version on every node")
    try:
        return worker.call(lambda calls: cast(RayCalls, calls).load_named(model, config, options, spec))
    except ValueError as exc:
        raise InvalidInput(f"backend {backend!r} cannot load {model} for {what} on Ray node {host} (pid {pid}): "
                           f"{exc}") from exc


def _gone(what: str, exc: Exception) -> str:
    """One line for an actor that died: Ray's message is many (a creation task's traceback ends
    with the exception the actor raised while starting)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    if getattr(exc, "actor_init_failed", False):
        return f"the Ray actor of {what} failed to start: {lines[-1]}"
    return f"the Ray actor of {what} is gone ({lines[0]})"
