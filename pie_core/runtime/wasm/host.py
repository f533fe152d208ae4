"""The host side of a wasm inferlet: wasmtime runs the component in a thread of its own, and
every WIT import is the engine's host function of the same name.

- The imports are linked once per :class:`WasmHost` (:mod:`.linking`) and serve every instance:
  a call finds its instance's :class:`~.imports.Guest` by its store.
- A synchronous import runs its host function on the guest's own thread when the function
  touches no event-loop state (:func:`~pie_core.host.binding.any_thread`), else on the engine's
  loop, bound to the instance, while the guest's thread waits.
- An async import starts the host coroutine and returns a call number; the guest's loop blocks
  in ``poll.wait`` until one of its calls finished (or, with one call pending, in the
  ``<name>-result`` import that takes its value). A call the guest cancels is cancelled on the
  engine.
- Engine objects cross as resources; the guest holds only their number, and a number the
  engine never gave this instance is refused.
- A host error crosses as the ``error`` record and is raised in the guest as its class.
- The guest has no filesystem but ``/inferlet`` (its own folder, read-only), ``/python`` (the
  standard library built with the component, read-only) and ``/scratch`` (its user's
  scratch directory), no sockets and no subprocesses (WASI gives none); its
  memory is capped by the store's limits and its time by epochs (the engine's clock ticks
  every :data:`TICK_S`; at each tick the store's epoch callback traps a guest that was
  cancelled or ran past its wall-time limit). A guest waiting rather than running waits in the
  host, never in WASI: its clock waits (``time.sleep``, ``select``) go through ``poll.wait``
  (``pie_guest/clock.py``), which returns early when the guest must stop; its imports fail from
  then on, and the next epoch tick traps it. The thread, the store and its memory are freed
  when ``run`` returns.
- ``print`` and ``sys.stdout``/``sys.stderr`` reach the client through the ``session.send`` and
  ``session.write_stderr`` imports (``pie_guest/stdio.py``), in order with the guest's other
  calls. WASI's fds 1 and 2 are left to wasmtime's default, which discards what is written
  (``os.write``), as a worker process's ``/dev/null`` does: wasmtime's custom output streams
  take 8192 bytes a write and call back from its own threads, after the guest moved on.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import component as wc

from pie_core.errors import Unsupported
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime.wasm import linking
from pie_core.runtime.wasm.build import stdlib_path
from pie_core.runtime.wasm.imports import GUEST_SCRATCH, Guest

__all__ = ["WasmHost", "GuestLimits", "GuestResult", "TICK_S", "live_stores"]

TICK_S = 0.05
"""Seconds between epoch ticks: how late a guest past its deadline may still run."""

MAX_RETURN_BYTES = 8 * 2**20
"""Largest JSON text of ``main``'s value (what a client takes in one frame by default)."""
MAX_RETURN_CONTAINERS = 2**16
"""Most lists and dicts in ``main``'s value (as in one of the process runner's frames): a
value sharing one list at every level (``x = [x, x]`` twenty times) is 2**20 of them once
copied out of the guest."""
MAX_RETURN_VALUES = 2**20
"""Most values in ``main``'s value: parsing each costs the GIL ~0.1 us."""
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')

_STORES = [0]  # stores open now: one per guest still in WasmHost.run
_STORES_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class GuestLimits:
    """What one wasm instance may use: wall seconds (0 = none) and linear memory in MiB."""

    wall_s: float = 600.0
    memory_mb: int = 4096


@dataclass(slots=True)
class GuestResult:
    """How a guest ended: ``ok`` with its JSON value, or not with the reason."""

    ok: bool
    value: Any


class WasmHost:
    """A compiled component and the engine it runs on; one per process, shared by instances.

    Args:
        component: The ``.wasm`` file (:func:`~.build.component_path`); its compiled form is
            cached beside it (``.cwasm``), keyed by the wasmtime version, and its standard
            library too (:func:`~.build.stdlib_path`), mounted read-only at ``/python``.
        python: False for a JavaScript component (:mod:`.js_build`): it has no standard-library
            folder and no ``/python`` mount.

    Raises:
        Unsupported: The standard-library folder beside ``component`` is missing.
    """

    def __init__(self, component: Path, *, python: bool = True) -> None:
        self.stdlib: Path | None = stdlib_path(component) if python else None
        if self.stdlib is not None and not (self.stdlib / "os.py").is_file():
            raise Unsupported(f"the guest's standard library {self.stdlib} is missing beside {component.name}; "
                              f"delete {component} and start again to rebuild both (component_path does)")
        config = wasmtime.Config()
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        compiled = component.with_suffix(f".wasmtime-{metadata.version('wasmtime')}.cwasm")
        if compiled.exists():
            self.component = wc.Component.deserialize_file(self.engine, str(compiled))
        else:
            self.component = wc.Component.from_file(self.engine, str(component))
            part = compiled.with_suffix(".part")
            part.write_bytes(self.component.serialize())
            part.replace(compiled)
        self._linker = linking.link(self.engine, self._import_types())
        threading.Thread(target=self._tick, name="pie-wasm-epochs", daemon=True).start()

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            self.engine.increment_epoch()

    def _import_types(self) -> dict[tuple[str, str], wc.FuncType]:
        found = {}
        for name, item in self.component.type.imports(self.engine).items():
            if not name.startswith(linking.PACKAGE + "/"):
                continue
            iface = name.split("/", 1)[1].split("@", 1)[0]
            for fname, ext in item.ty.exports(self.engine).items():
                ftype = ext.ty
                if isinstance(ftype, wc.FuncType):
                    found[iface, fname] = ftype
        return found

    def run(self, root: Path, scratch: str, request: dict[str, Any], inst: HostInstance,
            loop: asyncio.AbstractEventLoop, limits: GuestLimits, runner: Any = None,
            cancelled: threading.Event | None = None) -> GuestResult:
        """Run the inferlet at ``root`` to its end, in the calling thread (not the loop's).

        ``request`` is ``{"entry", "input"}``; host calls run on ``loop`` bound to ``inst``.
        ``runner`` runs ``runtime.spawn``'s children (None: in-process). Once ``cancelled`` is
        set, every host call fails, so a guest waiting on the engine ends at once.
        """
        deadline = time.monotonic() + limits.wall_s if limits.wall_s > 0 else float("inf")
        guest = Guest(inst, loop, runner, cancelled or threading.Event(), deadline=deadline, wall_s=limits.wall_s)
        store = wasmtime.Store(self.engine)
        with _STORES_LOCK:
            _STORES[0] += 1
        wasi = wasmtime.WasiConfig()
        wasi.preopen_dir(str(root), "/inferlet", fs_mutable=False)
        if self.stdlib is not None:
            wasi.preopen_dir(str(self.stdlib), "/python", fs_mutable=False)  # where the guest's sys.path looks
        wasi.preopen_dir(scratch, GUEST_SCRATCH)
        store.set_wasi(wasi)
        if limits.memory_mb > 0:
            store.set_limits(memory_size=limits.memory_mb * 2**20)
        linking.attach(store, guest)  # its epoch callback traps the guest once it must stop
        token = bind(inst)
        try:
            instance = self._linker.instantiate(store, self.component)
            run = instance.get_func(store, "run")
            outcome = run(store, json.dumps(request))
        except wasmtime.WasmtimeError as exc:
            return GuestResult(False, guest.stop_reason() or _trap(exc, limits))
        except Exception as exc:  # noqa: BLE001 - a host-side failure ends this instance only
            return GuestResult(False, f"{type(exc).__name__}: {exc}")
        finally:
            guest.cancel_all()
            linking.detach(store)
            unbind(token)
            store.close()  # its memory goes now, not when a traceback that holds it is collected
            with _STORES_LOCK:
                _STORES[0] -= 1
        if outcome.tag != "ok":  # result<string, string>: both cases are str, so wasmtime tags them
            return GuestResult(False, outcome.payload)
        return _returned(outcome.payload)


def _returned(payload: str) -> GuestResult:
    """``main``'s value from its JSON text, bounded before it is parsed: parsing holds the GIL
    (the engine's loop waits meanwhile), so the text's size, lists and dicts, and values are
    counted first, outside its strings, by C scans of the text."""
    if len(payload) > MAX_RETURN_BYTES:
        return GuestResult(False, f"main's value takes {len(payload)} bytes as JSON, over the {MAX_RETURN_BYTES} an "
                                  "inferlet may return; send large data with session.send_file")
    counted = payload
    for _ in range(2):  # first the raw text; when over, the text without its strings (exact for JSON)
        containers = counted.count("[") + counted.count("{")
        values = containers + counted.count(",")
        if containers <= MAX_RETURN_CONTAINERS and values <= MAX_RETURN_VALUES:
            return GuestResult(True, json.loads(payload))
        counted = _JSON_STRING.sub('""', payload)
    return GuestResult(False, f"main's value holds {containers} lists and dicts and {values} values, over the "
                              f"{MAX_RETURN_CONTAINERS} and {MAX_RETURN_VALUES} an inferlet may return; flatten it, or "
                              "send large data with session.send_file")


def live_stores() -> int:
    """Stores of guests not yet freed (each holds its guest's linear memory): a guest's store
    is closed, its memory freed, as its thread leaves :meth:`WasmHost.run`."""
    return _STORES[0]


def _trap(exc: wasmtime.WasmtimeError, limits: GuestLimits) -> str:
    text = str(exc)
    if "interrupt" in text:
        return f"killed: the inferlet ran past its wall-time limit of {limits.wall_s:g}s"
    if "memory" in text and ("grow" in text or "limit" in text or "out of" in text):
        return f"killed: the inferlet exceeded its memory limit of {limits.memory_mb} MiB"
    cause = text.split("Caused by:")[-1].strip().splitlines()
    return f"the inferlet's sandbox trapped: {cause[0] if cause else text[:200]}"
