"""The engine: per loaded model, one or more replicas, each a backend worker with its page pool
and batcher; inferlets are placed on a replica when they first use the model."""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from pie_core import __version__
from pie_core.adapters.store import AdapterStore
from pie_core.backend import BackendWorker
from pie_core.engine.broker import Broker
from pie_core.engine.placement import Demand, place
from pie_core.errors import BackendError, InvalidInput, NotFound
from pie_core.hookspec import BackendOptions, Capabilities
from pie_core.kv.accounts import PageAccounts
from pie_core.kv.context import KvContext
from pie_core.kv.host_pool import HostPool
from pie_core.kv.pool import PagePool
from pie_core.kv.snapshots import SnapshotStore
from pie_core.mcp.registry import McpRegistry
from pie_core.plugins import available_backends, bind_backend
from pie_core.scheduler.batcher import Batcher
from pie_core.scheduler.credits import DEFAULT_ENDOWMENT, Ledger
from pie_core.scheduler.market import Market
from pie_core.scheduler.passes import tag_valid
from pie_core.scheduler.trace import from_env as trace_from_env

__all__ = ["Engine", "LoadedModel", "default_backend_name", "replica_device"]

Progress = Callable[[int, int], None]


def default_backend_name() -> str:
    """``torch`` where installed, else ``cpu``, else whatever is there."""
    names = available_backends()
    for preferred in ("torch", "cpu"):
        if preferred in names:
            return preferred
    return next(iter(sorted(names)), "dummy")


@dataclass(slots=True)
class LoadedModel:
    """One replica of a model: one backend instance, which only ``worker`` calls, with its own
    page pool, batcher and market. ``source`` (spec, tokenizer, chat format) is shared by a
    model's replicas; ``Engine.models`` holds replica 0, ``Engine.replicas`` all of them."""

    name: str
    source: Any  # pie_core.models.registry.ModelSource
    backend: str
    worker: BackendWorker
    caps: Capabilities
    pool: PagePool
    batcher: Batcher
    market: Market
    index: int = 0
    """The replica's place in ``Engine.replicas[name]``."""
    alive: bool = True
    """False once a batch failed on its backend with more than one replica: placement skips it."""
    bound: int = 0
    """Inferlets placed on this replica that still run."""

    @property
    def load(self) -> int:
        """Placement's load: bound inferlets, plus passes queued and in flight."""
        return self.bound + self.batcher.queued + self.batcher.in_flight

    @property
    def spec(self) -> Any:
        return self.source.spec

    @property
    def tokenizer(self) -> Any:
        return self.source.tokenizer

    @property
    def chat(self) -> Any:
        return self.source.chat


def replica_device(device: str, index: int, replicas: int) -> str:
    """The device replica ``index`` of ``replicas`` loads on: a bare ``cuda`` is spread over
    ``cuda:0``, ``cuda:1``, ...; any other device (``cpu``, ``cuda:2``) is shared by all."""
    return f"cuda:{index}" if replicas > 1 and device == "cuda" else device


def _replayable(kv: KvContext) -> bool:
    return kv.lineage.replayable and all(tag_valid(tag) for tag in kv.lineage.tags())


class Engine:
    """Loads models onto a backend and owns what inferlets share: pools, batchers, ids."""

    def __init__(
        self,
        backend: str | None = None,
        *,
        options: BackendOptions | None = None,
        policy: str = "adaptive",
        config: Any = None,
        host_pages: int | None = None,
        endowment: float = DEFAULT_ENDOWMENT,
        replicas: int = 1,
        ray: str | None = None,
    ) -> None:
        """
        Args:
            backend: The backend's name (None = :func:`default_backend_name`).
            options: What the backend is asked for (dtype, pool sizes, extras).
            policy: The batching policy (``adaptive`` or ``greedy``).
            config: The loaded configuration (models, MCP servers).
            host_pages: Host pool pages suspended contexts may be copied to (None = all the
                backend has; 0 = none: suspended contexts are rebuilt by replay).
            endowment: Credits each inferlet starts with in a model's KV-page market.
            replicas: Backend instances per loaded model (data parallel), each with its own
                worker thread, page pools, batcher and market.
            ray: Run each replica's backend in a Ray actor (:mod:`pie_core.scaleout`): a Ray
                cluster's address, ``"local"`` to start a Ray on this machine, or ``""`` for
                ``RAY_ADDRESS`` else local; a process already connected to Ray keeps its
                connection. None (the default): every backend runs in this process.

        Raises:
            Unsupported: ``ray`` is set and Ray is not installed.
        """
        if host_pages is not None and host_pages < 0:
            raise ValueError(f"host_pages must be >= 0, got {host_pages}")
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.num_replicas = replicas
        self.backend = backend or default_backend_name()
        self.options = options or BackendOptions(dtype="auto")  # each backend's best precision
        self.policy = policy
        self.config = config
        self.host_pages = host_pages
        self.endowment = endowment
        self.instance_id = uuid.uuid4().hex[:12]
        self.version = __version__
        self.models: dict[str, LoadedModel] = {}  # replica 0 of each model
        self.replicas: dict[str, list[LoadedModel]] = {}
        self.snapshots = SnapshotStore()
        self.adapters = AdapterStore()
        self.broker = Broker()
        self.mcp = McpRegistry(config)  # MCP servers: configured ones start on first connect
        if self.backend not in available_backends():
            bind_backend(self.backend)  # raises NotFound listing the installed backends
        self.ray = ray
        self._ray_joined = False  # this engine connected to Ray (it disconnects in close)
        if ray is not None:
            from pie_core.scaleout.ray_cluster import connect

            cpu_replicas = 0 if self.options.device.startswith("cuda") else replicas
            self._ray_joined = connect(ray or None, num_cpus=max(os.cpu_count() or 1, cpu_replicas))

    def load(self, name: str | None = None, progress: Progress | None = None, *,
             replicas: int | None = None) -> LoadedModel:
        """Resolve a model by name (None = the default), load it on the backend, return it
        (replica 0; ``replicas[name]`` lists them all).

        Args:
            name: The model (None = the configured default).
            progress: Called with (done, total) bytes while weights are read.
            replicas: Replicas of this model (None = the engine's ``replicas``).

        Raises:
            NotFound: No model of that name.
            InvalidInput: The backend refused an option or a weight (its ``ValueError``).
            ValueError: ``replicas`` < 1.
            BackendError: On Ray, an actor did not start, failed to, or runs another Pie.
        """
        from pie_core.models.registry import resolve_model

        count = self.num_replicas if replicas is None else replicas
        if count < 1:
            raise ValueError(f"replicas must be >= 1, got {count}")
        source = resolve_model(name, self.config)
        if source.name in self.models:
            return self.models[source.name]
        if self.ray is not None:  # every actor starts and reads the model at once
            started = self._start_on_ray(source, count)
            loaded = [self._replica(source, index, worker, caps) for index, (worker, caps) in enumerate(started)]
        else:
            loaded = []
            try:
                for index in range(count):
                    worker, caps = self._start_here(source, index, count, progress)
                    loaded.append(self._replica(source, index, worker, caps))
            except BaseException:
                for replica in loaded:
                    replica.worker.close()
                raise
        PageAccounts.link([replica.pool.accounts for replica in loaded])  # one user, one page quota
        self.models[source.name] = loaded[0]
        self.replicas[source.name] = loaded
        return loaded[0]

    def _start_on_ray(self, source: Any, count: int) -> list[tuple[BackendWorker, Capabilities]]:
        """``count`` workers, each over a Ray actor that read ``source`` by its name."""
        import tomlkit

        from pie_core import config as pie_config
        from pie_core.scaleout.ray_calls import start_ray_replicas

        text = tomlkit.dumps(self.config if self.config is not None else pie_config.load_config())
        whats = [f"replica {index} of {source.name!r}" for index in range(count)]
        return start_ray_replicas(self.backend, whats, source.name, text, self.options, source.spec)

    def _start_here(self, source: Any, index: int, count: int,
                    progress: Progress | None) -> tuple[BackendWorker, Capabilities]:
        """A worker over the backend bound in this process, with ``source`` loaded."""
        # The load runs on the thread the batches will (see pie_core.backend.backend_thread).
        worker = BackendWorker(bind_backend(self.backend))
        try:
            # A backend that stores its own layout of the weights needs them once: no float32 copy stays.
            keep = not getattr(worker.call(lambda b: b.info()), "keeps_derived_weights", False)
            weights = source.weights(progress=progress, keep=keep)
            options = dataclasses.replace(self.options, weights_key=source.cache_key,
                                          device=replica_device(self.options.device, index, count))
            caps: Capabilities = worker.call(lambda b: b.load_model(source.spec, weights, options))
        except BaseException as exc:
            worker.close(wait=isinstance(exc, Exception))  # an interrupted load (Ctrl-C) is not waited for
            if isinstance(exc, ValueError):  # the hook's documented refusal: an option or a weight it cannot take
                raise InvalidInput(f"backend {self.backend!r} cannot load {source.name}: {exc}") from exc
            raise
        return worker, caps

    def _replica(self, source: Any, index: int, worker: BackendWorker, caps: Capabilities) -> LoadedModel:
        """Replica ``index`` of ``source`` over a loaded worker: its pools, batcher and market."""
        pool = PagePool(caps.num_pages, caps.page_size)
        host = HostPool(caps.num_host_pages if self.host_pages is None else min(self.host_pages, caps.num_host_pages))
        markets: list[Market] = []
        batcher = Batcher(
            worker,
            caps,
            self.policy,
            on_batch=lambda seconds: markets[0].tick(seconds),
            trace=trace_from_env(caps.page_size),
        )
        market = Market(pool, host, worker.enqueue_copy, Ledger(self.endowment), _replayable)
        markets.append(market)
        model = LoadedModel(
            name=source.name,
            source=source,
            backend=self.backend,
            worker=worker,
            caps=caps,
            pool=pool,
            batcher=batcher,
            market=market,
            index=index,
        )
        batcher.on_failure = lambda exc: self._failed(model, exc)
        return model

    def model(self, name: str) -> LoadedModel:
        """A loaded model by name.

        Raises:
            NotFound: The name is not loaded (the message lists the loaded names).
        """
        try:
            return self.models[name]
        except KeyError:
            raise NotFound(f"model {name!r} is not loaded; loaded models: {', '.join(self.models) or 'none'}") from None

    def place(self, name: str, demand: Demand | None = None) -> LoadedModel:
        """The replica of model ``name`` a new inferlet with ``demand`` runs on
        (:mod:`pie_core.engine.placement`); the replica counts it as bound.

        Raises:
            NotFound: The name is not loaded.
        """
        replicas = self.replicas.get(self.model(name).name) or [self.models[name]]
        replica = replicas[0] if len(replicas) == 1 else place(replicas, demand or Demand())
        replica.bound += 1
        return replica

    def replica_of(self, name: str, pool: PagePool) -> LoadedModel:
        """The replica of model ``name`` whose page pool is ``pool`` (a snapshot's or a
        context's: they stay on their replica)."""
        for replica in self.replicas.get(name, ()):
            if replica.pool is pool:
                return replica
        return self.model(name)

    def _failed(self, replica: LoadedModel, error: Exception) -> None:
        # One replica's failure must not stop the others: it is dead, what waits on it fails,
        # its inferlets' next passes fail (host.inference), placement skips it. With one
        # replica nothing changes (a failed batch fails its own requests, as it always did).
        if len(self.replicas.get(replica.name, ())) > 1 and replica.alive:
            replica.alive = False
            replica.batcher.stop(BackendError(f"replica {replica.index} of {replica.name!r} died: {error}"))

    def all_replicas(self) -> list[LoadedModel]:
        """Every replica of every loaded model."""
        return [r for name, m in self.models.items() for r in self.replicas.get(name, [m])]

    def pools_whole(self) -> bool:
        """True when every page of every replica of every model is back in its pool and every
        host slot free (snapshots hold pages)."""
        return all(m.pool.is_whole() and m.market.is_whole() for m in self.all_replicas())

    async def close(self) -> None:
        for model in self.all_replicas():
            await model.batcher.close()  # a replica on Ray: its actor is killed
        await self.mcp.close()
        if self._ray_joined:
            from pie_core.scaleout.ray_cluster import import_ray

            import_ray().shutdown()
            self._ray_joined = False
