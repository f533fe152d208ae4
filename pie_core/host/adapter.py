"""Host interface ``adapter``: LoRA adapters, named per model and user.

An adapter lives while a handle to it is held (see :mod:`pie_core.adapters.store`); ``save`` and
``load`` move it through a folder in the Hugging Face PEFT layout. Under ``pie serve`` a path is
relative to the user's scratch directory and may not leave it; under ``pie run`` it is a path
on the local machine. Backend work is ordered before the caller's next pass, so these calls
return at once; :func:`settled` waits for it and reports a failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pie_core import safepath
from pie_core.adapters import peft
from pie_core.adapters.folder_order import Shape
from pie_core.adapters.store import AdapterRecord
from pie_core.backend import BackendCalls
from pie_core.errors import InvalidInput, PieError
from pie_core.host.binding import HostInstance, any_thread, current
from pie_core.host.model import resolve
from pie_core.host.runtime import open_scratch, scratch_of
from pie_core.backend_kit.lora import check_tensors

__all__ = ["HostAdapter", "create", "open_adapter", "fork", "save", "load", "settled", "release", "release_soon",
           "name", "check_live", "is_released"]

_NO_SEEDS = np.zeros(0, dtype=np.int64)
_NO_COEFFS = np.zeros(0, dtype=np.float32)

DEFAULT_RANK = 8
"""Rank of an adapter made by ``create`` (``load`` and ``zo.initialize`` set their own)."""


class HostAdapter:
    """A handle to an adapter held by one inferlet instance (released with it)."""

    released: bool

    def __init__(self, record: AdapterRecord, owner: HostInstance) -> None:
        self.record = record
        self.owner = owner
        self.released = False
        self.thread = threading.get_ident()
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        owner.engine.adapters.hold(record)
        owner.resources.add(self)

    def check_live(self) -> None:
        if self.released:
            raise PieError("this adapter handle was released; open the adapter again")

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.owner.resources.discard(self)
        self.owner.engine.adapters.drop(self.record)


def create(model: str, name: str) -> HostAdapter:
    """A new adapter ``name`` on ``model`` for the calling user: rank 8 over every projection,
    all zeros (it changes nothing until loaded or trained with zo).

    Raises:
        InvalidInput: The name is empty or taken, the backend holds all the adapters it can,
            or the user's adapter quota is reached.
        Unsupported: The backend does not run adapters.
    """
    loaded, inst = resolve(model), current()
    record = inst.engine.adapters.create(loaded, inst.username, name, DEFAULT_RANK, float(DEFAULT_RANK))
    return HostAdapter(record, inst)


def open_adapter(model: str, name: str) -> HostAdapter | None:
    """A new handle to the calling user's adapter ``name``, or None if it does not exist."""
    loaded, inst = resolve(model), current()
    record = inst.engine.adapters.get(loaded.name, inst.username, name)
    return None if record is None else HostAdapter(record, inst)


def name(adapter: HostAdapter) -> str:
    """The adapter's name."""
    return adapter.record.name


def check_live(a: HostAdapter) -> None:
    """Raise PieError if ``a`` was released; nothing while it is live."""
    a.check_live()


def is_released(a: HostAdapter) -> bool:
    """Whether the handle was released."""
    return a.released


def fork(adapter: HostAdapter, new_name: str) -> HostAdapter:
    """A copy of the adapter's current weights (and zo state) under ``new_name``.

    Raises:
        InvalidInput: As :func:`create`.
    """
    adapter.check_live()
    src, inst = adapter.record, current()
    store = inst.engine.adapters
    record = store.create(src.model, inst.username, new_name, src.rank, src.alpha)
    try:
        store.reshape(record, src.rank, src.alpha, src.rslora, src.targets)
    except InvalidInput:
        store.discard(record)
        raise
    record.zo = None if src.zo is None else dataclasses.replace(src.zo)
    sigma = None if src.zo is None else src.zo.sigma

    def copy(backend: BackendCalls) -> None:
        tensors = backend.adapter_save(src.id)
        backend.adapter_load(record.id, tensors, record.scaling)
        if sigma is not None:
            backend.adapter_zo(record.id, sigma, _NO_SEEDS, _NO_COEFFS)

    record.backend(copy)
    return HostAdapter(record, inst)


def save(adapter: HostAdapter, path: str) -> None:
    """Write the adapter's mean weights to the PEFT folder ``path`` (created if missing), after
    every operation asked of the adapter and of that folder before.

    Raises:
        InvalidInput: ``path`` is absolute or holds ``..`` (under ``pie serve``). A folder that
            turns out unusable when the save runs (a link or a file in the way) is reported by
            :func:`settled`, with the one message of :func:`pie_core.adapters.peft.unusable`.
    """
    adapter.check_live()
    folder = _folder(path)
    record, order = adapter.record, current().engine.adapters.folders
    rank, alpha, rslora, base_model = record.rank, record.alpha, record.rslora, record.model.name  # as of now
    before, ran = order.join(folder.key, Shape(rank, alpha, rslora, frozenset(record.targets)))

    def write(backend: BackendCalls) -> None:  # on the backend thread, after every earlier change to the adapter
        try:
            if before is not None:
                before.wait()
            tensors = backend.adapter_save(record.id)
            with folder.opened(create=True) as fd:
                try:
                    peft.write(fd, peft.PeftAdapter(tensors, rank, alpha, rslora), base_model)
                except OSError:
                    raise peft.unusable(folder.shown) from None
        finally:
            ran.set()

    order.settle(folder.key, ran, record.backend(write))


def load(adapter: HostAdapter, path: str) -> None:
    """Replace the adapter's weights with the PEFT folder ``path`` (its rank, alpha and targets
    too). The folder is read and checked now, unless a save or load of the same folder is still
    pending: then it is read right after that one ran, and the shape that save writes is taken
    now. Either way the weights reach the backend before the next pass.

    Raises:
        InvalidInput: The path is absolute or holds ``..`` (under ``pie serve``), the folder is
            not a PEFT LoRA adapter for this model (one message whatever is there), its rank is
            beyond the backend's, or the user's adapter quota would be passed. The adapter is
            unchanged. A chained read that fails is reported by :func:`settled`.
    """
    adapter.check_live()
    record = adapter.record
    folder = _folder(path)
    order = current().engine.adapters.folders
    coming = order.pending(folder.key)
    if coming is None:
        with folder.opened(create=False) as fd:
            read = peft.read(fd, folder.shown, links=folder.local)
        tensors, rank, targets = _checked(record, read, folder.shown)
        current().engine.adapters.reshape(record, rank, read.alpha, read.rslora, targets)
        scaling = record.scaling
        record.backend(lambda backend: backend.adapter_load(record.id, tensors, scaling))
        return
    targets = tuple(sorted(coming.targets))
    current().engine.adapters.reshape(record, coming.rank, coming.alpha, coming.rslora, targets)
    scaling, limit = record.scaling, record.bytes + (1 << 20)  # float32 weights and their header
    before, ran = order.join(folder.key)

    def read_then_load(backend: BackendCalls) -> None:  # on the backend thread, after the folder's pending operations
        try:
            if before is not None:
                before.wait()
            with folder.opened(create=False) as fd:
                read = peft.read(fd, folder.shown, links=folder.local, max_weights=limit)
            tensors, rank, got = _checked(record, read, folder.shown)
            if (rank, read.alpha, read.rslora, got) != (coming.rank, coming.alpha, coming.rslora, targets):
                raise InvalidInput(f"{folder.shown}: the folder changed between the save and this load; load it again")
            backend.adapter_load(record.id, tensors, scaling)
        finally:
            ran.set()

    order.settle(folder.key, ran, record.backend(read_then_load))


def _checked(record: AdapterRecord, read: peft.PeftAdapter, path: str) -> tuple[dict[str, Any], int, tuple[str, ...]]:
    """The tensors of ``read``, their rank and targets, checked against the adapter's model."""
    try:
        rank = check_tensors(record.model.spec, read.tensors, record.model.caps.max_adapter_rank)
    except ValueError as exc:
        raise InvalidInput(f"{path}: {exc}") from None
    if rank != read.rank:
        raise InvalidInput(f"{path}: adapter_config.json says r={read.rank} but the weights have rank {rank}")
    return read.tensors, rank, tuple(sorted({n.split(".")[2] for n in read.tensors}))


async def settled(adapter: HostAdapter) -> None:
    """Wait until the backend ran every operation asked of this adapter so far.

    Raises:
        BackendError: One failed (each failure is reported once).
    """
    await adapter.record.settled()


def release(adapter: HostAdapter) -> None:
    """Drop this handle now (the adapter goes when no handle holds it). Idempotent."""
    adapter.release()


@any_thread
def release_soon(adapter: HostAdapter) -> None:
    """Release from a finaliser, which may run on any thread (see ``context.release_soon``)."""
    if threading.get_ident() == adapter.thread:
        adapter.release()
    elif adapter.loop is not None and not adapter.loop.is_closed():
        adapter.loop.call_soon_threadsafe(adapter.release)


@dataclass(frozen=True, slots=True)
class _Folder:
    """The folder a save or load names: ``parts`` beneath the user's scratch folder (``pie
    serve``), or the local path ``parts[0]`` (``pie run``, ``local``; the operator's machine,
    links followed)."""

    root: Path | None
    user: str
    parts: tuple[str, ...]

    @property
    def local(self) -> bool:
        return self.root is None

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return self.user, self.parts

    @contextmanager
    def opened(self, *, create: bool) -> Iterator[int]:
        """A descriptor of the folder (made if missing with ``create``).

        Raises:
            InvalidInput: :func:`pie_core.adapters.peft.unusable`, whatever the reason.
        """
        try:
            if self.root is None:
                fd = safepath.open_root(self.parts[0], create=create)
            else:
                scratch = open_scratch(self.root, self.user)
                try:
                    fd = safepath.open_dir(scratch, self.parts, create=create)
                finally:
                    os.close(scratch)
        except OSError:
            raise peft.unusable(self.shown) from None
        try:
            yield fd
        finally:
            os.close(fd)

    @property
    def shown(self) -> str:
        return self.parts[0] if self.root is None else "/".join(self.parts)


def _folder(path: str) -> _Folder:
    inst = current()
    if inst.scratch_root is not None:
        root, user = scratch_of(inst)
        return _Folder(root, user, safepath.parts_of(path, "scratch directory"))
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidInput(f"an adapter path must be a non-empty string, got {path!r}")
    return _Folder(None, inst.username, (os.path.abspath(os.path.expanduser(path)),))
