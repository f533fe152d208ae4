"""LoRA adapters: ``Adapter.create(model, name)``, ``Adapter.open(model, name)``.

An adapter is named per model and user. It lives while a handle holds it: the handle is
released when the ``Adapter`` is garbage-collected, when a ``with`` block around it ends, or
when the inferlet ends; there is no ``destroy()``. ``save`` / ``load`` use a folder in the
Hugging Face PEFT layout (``adapter_config.json`` + ``adapter_model.safetensors``), so adapters
trained with PEFT for the same base model load here and the other way round. Under
``pie serve`` paths are relative to the user's scratch directory and are never followed
through a link. Saves and loads of one folder apply in the order they were asked.

Apply one with ``ctx.generate(..., adapter=a)``, ``g.adapter(a)`` or ``fwd.adapter(a)``.
"""

from __future__ import annotations

from typing import Any, Generator as _Gen

from inferlet.host import adapter as _host
from inferlet.host import types as _types
from inferlet.model import Model

__all__ = ["Adapter", "Scheduled"]


class Scheduled:
    """The backend work of ``save``, ``load`` or a ``zo`` call: it runs before the inferlet's
    next forward pass whether or not this is awaited; ``await`` it to wait until it ran (and
    to see a failure: ``InvalidInput`` for a folder found unusable, ``BackendError`` for the
    rest)."""

    def __init__(self, handle: _types.Adapter) -> None:
        self._handle = handle

    def __await__(self) -> _Gen[Any, None, None]:
        return _host.settled(self._handle).__await__()


class Adapter:
    """A handle to a LoRA adapter of one model (see the module doc)."""

    def __init__(self, model: Model, handle: _types.Adapter) -> None:
        """Use :meth:`create` or :meth:`open` rather than this."""
        self._model = model
        self._handle = handle

    @staticmethod
    def create(model: Model, name: str) -> Adapter:
        """A new adapter ``name``: rank 8 on every projection, all zeros (it changes nothing
        until loaded or trained with ``zo``).

        Raises:
            InvalidInput: The name is taken or empty, or a backend or quota limit is reached.
            Unsupported: The backend does not run adapters.
        """
        return Adapter(model, _host.create(model.name, name))

    @staticmethod
    def open(model: Model, name: str) -> Adapter | None:
        """The adapter ``name`` if it exists (held by this or another of your inferlets)."""
        handle = _host.open_adapter(model.name, name)
        return None if handle is None else Adapter(model, handle)

    @property
    def name(self) -> str:
        return _host.name(self._handle)

    @property
    def model(self) -> Model:
        return self._model

    def fork(self, new_name: str) -> Adapter:
        """A copy of the current weights (and zo state) under ``new_name``; the two then change
        independently."""
        return Adapter(self._model, _host.fork(self._handle, new_name))

    def save(self, path: str) -> Scheduled:
        """Write the weights to the PEFT folder ``path`` (created if missing). A folder found
        unusable when the write runs (a link or a file on the way) raises ``InvalidInput`` at
        the ``await``."""
        _host.save(self._handle, path)
        return Scheduled(self._handle)

    def load(self, path: str) -> Scheduled:
        """Replace the weights (rank, alpha and targets too) with the PEFT folder ``path``.
        The folder is read and checked at once; a bad one raises ``InvalidInput`` here. A
        save or load of the same folder still pending (``a.save(p); b.load(p)``) is waited for:
        the folder is read right after it, and a bad one raises at the ``await``."""
        _host.load(self._handle, path)
        return Scheduled(self._handle)

    def __enter__(self) -> Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        _host.release(self._handle)

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                _host.release_soon(handle)
            except Exception:  # never raise from a finaliser (e.g. at interpreter exit)
                pass

    def __repr__(self) -> str:
        return f"Adapter({self.name!r})"
