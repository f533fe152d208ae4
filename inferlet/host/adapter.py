"""Host interface ``adapter``: LoRA adapters, named per model and user.

An adapter lives while a handle to it is held (see :mod:`pie_core.adapters.store`); ``save`` and
``load`` move it through a folder in the Hugging Face PEFT layout. Under ``pie serve`` a path is
relative to the user's scratch directory and may not leave it; under ``pie run`` it is a path
on the local machine. Backend work is ordered before the caller's next pass, so these calls
return at once; :func:`settled` waits for it and reports a failure.
"""

from __future__ import annotations


from inferlet.host._declare import host
from inferlet.host.types import Adapter

__all__ = ["check_live", "create", "fork", "is_released", "load", "name", "open_adapter", "release", "release_soon",
           "save", "settled"]


@host
def check_live(a: Adapter) -> None:
    """Raise PieError if ``a`` was released; nothing while it is live."""


@host
def create(model: str, name: str) -> Adapter:
    """A new adapter ``name`` on ``model`` for the calling user: rank 8 over every projection,
    all zeros (it changes nothing until loaded or trained with zo).

    Raises:
        InvalidInput: The name is empty or taken, the backend holds all the adapters it can,
            or the user's adapter quota is reached.
        Unsupported: The backend does not run adapters.
    """


@host
def fork(adapter: Adapter, new_name: str) -> Adapter:
    """A copy of the adapter's current weights (and zo state) under ``new_name``.

    Raises:
        InvalidInput: As :func:`create`.
    """


@host
def is_released(a: Adapter) -> bool:
    """Whether the handle was released."""


@host
def load(adapter: Adapter, path: str) -> None:
    """Replace the adapter's weights with the PEFT folder ``path`` (its rank, alpha and targets
    too). The folder is read and checked now, unless a save or load of the same folder is still
    pending: then it is read right after that one (``a.save(p); b.load(p)`` loads what ``a``
    saved). The weights reach the backend before the next pass.

    Raises:
        InvalidInput: The path is absolute or holds ``..`` (under ``pie serve``, where it is
            opened beneath the scratch directory and never through a link), the folder is not
            a PEFT LoRA adapter for this model (one message whatever is there), its rank is
            beyond the backend's, or the user's adapter quota would be passed. The adapter is
            unchanged. A read that waited for a pending save reports its failure in
            :func:`settled`.
    """


@host
def name(adapter: Adapter) -> str:
    """The adapter's name."""


@host
def open_adapter(model: str, name: str) -> Adapter | None:
    """A new handle to the calling user's adapter ``name``, or None if it does not exist."""


@host
def release(adapter: Adapter) -> None:
    """Drop this handle now (the adapter goes when no handle holds it). Idempotent."""


@host(oneway=True)
def release_soon(adapter: Adapter) -> None:
    """Release from a finaliser, which may run on any thread (see ``context.release_soon``)."""


@host
def save(adapter: Adapter, path: str) -> None:
    """Write the adapter's mean weights to the PEFT folder ``path`` (created if missing), after
    every operation asked of the adapter and of that folder before.

    Raises:
        InvalidInput: ``path`` is absolute or holds ``..`` (under ``pie serve``). A folder found
            unusable when the write runs (a link or a file on the way) is reported by
            :func:`settled`.
    """


@host
async def settled(adapter: Adapter) -> None:
    """Wait until the backend ran every operation asked of this adapter so far.

    Raises:
        InvalidInput: A save or a waiting load found its folder unusable (reported once).
        BackendError: Another one failed (each failure is reported once).
    """
