"""The adapters of an engine, per model and user, and their lives on the backend.

An adapter is named per ``(model, user, name)``; one user never sees another's. It lives while
an inferlet holds a handle to it or a pass runs with it: when the last handle is released (an
SDK ``Adapter`` garbage-collected, or its inferlet ending) and no pass uses it, the backend
frees it. Files (``save``/``load``) are how an adapter outlives its inferlets.

Every backend operation (create, load, save, zo, destroy) goes through the model's backend
worker (:meth:`~pie_core.backend.BackendWorker.enqueue_op`): it runs on the backend thread after
the batch in flight and before any pass submitted later, so callers need not wait for it.

An adapter's float32 bytes are charged to its user; ``limit_of(user)`` (set by the server,
None = unlimited) bounds them. A model holds up to :data:`MAX_ADAPTERS` adapters, however few
its backend holds at once: the backend worker parks idle ones on the host and pages them in by
use (:mod:`pie_core.backend.adapter_slots`).
"""

from __future__ import annotations

import asyncio
import builtins
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from pie_core.adapters.es import ZoState
from pie_core.adapters.folder_order import FolderOrder
from pie_core.backend import BackendCalls
from pie_core.errors import BackendError, InvalidInput, Unsupported
from pie_core.backend_kit.lora import TARGETS, adapter_bytes

__all__ = ["AdapterRecord", "AdapterStore", "MAX_ADAPTERS"]

MAX_ADAPTERS = 1024
"""Adapters of one model at once, resident on the backend or parked on the host."""


@dataclass(eq=False)
class AdapterRecord:
    """One adapter: its backend id, LoRA shape, owner, and who holds it.

    ``version`` changes whenever its weights do; with ``uid`` it keys KV pages computed under
    the adapter, so the prefix cache never mixes weights.
    """

    model: Any  # pie_core.engine.engine.LoadedModel
    user: str
    name: str
    id: int
    rank: int
    alpha: float
    rslora: bool = False
    targets: tuple[str, ...] = TARGETS
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    version: int = 0
    zo: ZoState | None = None
    handles: int = 0
    uses: int = 0
    destroyed: bool = False
    last: Any = None  # the future of the last backend operation
    failure: BaseException | None = None  # the first failed operation not yet reported
    _failing: threading.Lock = field(default_factory=threading.Lock, repr=False)  # failure is set on backend threads

    @property
    def scaling(self) -> float:
        return self.alpha / (self.rank**0.5 if self.rslora else self.rank)

    @property
    def bytes(self) -> int:
        return adapter_bytes(self.model.spec, self.rank, self.targets)

    def salt(self, zo_seed: int) -> builtins.bytes:  # ``bytes`` here is the property above
        """What KV pages computed with this adapter (and ``zo_seed``) are keyed by."""
        return f"{self.uid}:{self.version}:{zo_seed}".encode()

    def backend(self, op: Callable[[BackendCalls], Any]) -> Any:
        """Run ``op(calls)`` on the backend thread in order (see the module doc); a failure is
        kept in ``failure`` until :meth:`settled` reports it. Returns the operation's future
        (done when it ran; it never holds ``op``'s failure, so nothing reports that twice)."""

        def run(calls: BackendCalls) -> None:
            try:
                op(calls)
            except Exception as exc:  # noqa: BLE001 - kept for settled(), on whichever thread
                self._fail(exc)

        self.last = self.model.worker.enqueue_op(run)
        self.last.add_done_callback(self._done)
        return self.last

    def _done(self, future: Any) -> None:  # an operation the batcher failed without running it
        if not future.cancelled() and future.exception() is not None:
            self._fail(future.exception())

    def _fail(self, exc: BaseException) -> None:
        with self._failing:
            if self.failure is None:
                self.failure = exc

    async def settled(self) -> None:
        """Wait until every operation enqueued so far ran.

        Raises:
            InvalidInput: A save or a chained load found its folder unusable when it ran (reported once).
            BackendError: Another of them failed (reported once).
        """
        if self.last is not None and not self.last.done():
            await asyncio.wait([self.last])  # neither raises its failure (it is reported below, once) nor cancels it
        with self._failing:
            failure, self.failure = self.failure, None
        if isinstance(failure, InvalidInput):
            raise InvalidInput(f"adapter {self.name!r}: {failure}") from None
        if failure is not None:
            raise BackendError(f"adapter {self.name!r}: the backend failed: {failure}") from failure


class AdapterStore:
    """Adapters keyed by ``(model, user, name)``, with backend ids and per-user bytes."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str, str], AdapterRecord] = {}
        self._bytes: dict[str, int] = {}
        self.limit_of: Callable[[str], int | None] | None = None
        self.folders = FolderOrder()  # saves and loads of one folder, in the order issued

    def bytes_held(self) -> dict[str, int]:
        """Adapter bytes per user, for every user who holds any."""
        return {u: b for u, b in self._bytes.items() if b}

    def get(self, model: str, user: str, name: str) -> AdapterRecord | None:
        return self._items.get((model, user, name))

    def create(self, model: Any, user: str, name: str, rank: int, alpha: float) -> AdapterRecord:
        """A new adapter of ``rank`` over every target, all zeros, on the backend.

        Raises:
            InvalidInput: The name is empty or taken, the rank is out of range, the model holds
                :data:`MAX_ADAPTERS` adapters, or the user's adapter bytes would pass its quota.
            Unsupported: The backend does not run adapters.
        """
        if "adapters" not in model.caps.features:
            raise Unsupported(f"backend {model.backend!r} does not run LoRA adapters (feature 'adapters')")
        if not isinstance(name, str) or not name or len(name) > 256:
            raise InvalidInput(f"an adapter name must be a non-empty string of at most 256 characters, got {name!r}")
        if (model.name, user, name) in self._items:
            raise InvalidInput(f"adapter {name!r} exists; open it with Adapter.open or pick another name")
        self.check_rank(model, rank)
        held = {r.id for r in self._items.values() if r.model is model}
        if len(held) >= MAX_ADAPTERS:
            raise InvalidInput(
                f"model {model.name!r} holds {MAX_ADAPTERS} adapters at most (its backend {model.caps.max_adapters} at "
                "once, the rest parked on the host) and all are in use; release an adapter (drop its handles) first"
            )
        record = AdapterRecord(model, user, name, min(set(range(len(held) + 1)) - held), rank, float(alpha))
        self._charge(user, record.bytes)
        self._items[(model.name, user, name)] = record
        record.backend(lambda backend: backend.adapter_create(record.id, rank, record.scaling))
        return record

    def reshape(self, record: AdapterRecord, rank: int, alpha: float, rslora: bool, targets: tuple[str, ...]) -> None:
        """Charge ``record``'s user for a new LoRA shape and adopt it (weights change: new version).

        Raises:
            InvalidInput: The rank is out of range or the user's quota would be passed; nothing changes.
        """
        self.check_rank(record.model, rank)
        before = record.bytes
        after = adapter_bytes(record.model.spec, rank, targets)
        self._charge(record.user, after - before)
        record.rank, record.alpha, record.rslora, record.targets = rank, float(alpha), rslora, targets
        record.version += 1

    def check_rank(self, model: Any, rank: int) -> None:
        limit = model.caps.max_adapter_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= limit:
            raise InvalidInput(f"adapter rank must be an integer in [1, {limit}] on backend {model.backend!r}, got {rank!r}")

    def hold(self, record: AdapterRecord) -> None:
        record.handles += 1

    def drop(self, record: AdapterRecord) -> None:
        """One handle fewer; the adapter goes when nothing holds or uses it."""
        record.handles -= 1
        self._maybe_destroy(record)

    def use(self, record: AdapterRecord) -> None:
        record.uses += 1

    def unuse(self, record: AdapterRecord) -> None:
        record.uses -= 1
        self._maybe_destroy(record)

    def discard(self, record: AdapterRecord) -> None:
        """Free an adapter nothing holds yet (a create whose caller failed afterwards)."""
        if record.handles == 0 and record.uses == 0:
            self._maybe_destroy(record)

    def _maybe_destroy(self, record: AdapterRecord) -> None:
        if record.handles > 0 or record.uses > 0 or record.destroyed:
            return
        record.destroyed = True
        self._items.pop((record.model.name, record.user, record.name), None)
        self._charge(record.user, -record.bytes)
        record.backend(lambda backend: backend.adapter_destroy(record.id))

    def _charge(self, user: str, n: int) -> None:
        held = self._bytes.get(user, 0)
        limit = None if self.limit_of is None else self.limit_of(user)
        if n > 0 and limit and held + n > limit:
            raise InvalidInput(
                f"user {user} holds {held} bytes of adapters of its {limit} (quota server.quotas.adapter_bytes) "
                f"and needs {n} more; release adapters or use a lower rank"
            )
        self._bytes[user] = held + n
