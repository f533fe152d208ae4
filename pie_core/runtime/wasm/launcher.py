"""``WasmLauncher``: each inferlet runs as a WebAssembly component, in a thread of its own.

The same protocol as the other launchers (:class:`pie_core.runtime.launcher.Launcher`):
``start`` returns a task that emits the instance's events, frees everything it held, and ends
with a ``return`` or ``error`` event. ``pie run --isolation wasm`` uses :func:`run_wasm`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.errors import Unsupported
from pie_core.host import runtime as host_runtime
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime.instance import _jsonable
from pie_core.runtime.library import find_program
from pie_core.runtime.manifest import Manifest
from pie_core.runtime.wasm.build import component_path, toolchain_missing
from pie_core.runtime.wasm.host import GuestLimits, WasmHost
from pie_core.runtime.wasm.js_build import is_js_entry, js_component_path, js_toolchain_missing

__all__ = ["WasmLauncher", "run_wasm", "toolchain_missing", "wasm_missing", "JsInWasm"]

_MAX_JS_HOSTS = 32  # compiled JS components kept per launcher (each is its inferlet's own)

_MAX_ERROR = 16 * 1024  # characters of a guest's error text that reach the client
_FREE_GRACE_S = 30.0  # how long a cancelled instance may take to leave its thread (it takes one epoch tick)
_log = logging.getLogger(__name__)


class WasmLauncher:
    """Runs inferlets in the wasm sandbox under ``limits``; the component is built (or taken
    from the cache) on the first start, off the event loop, unless ``host`` is given (launchers
    with different limits may share one). ``on_build`` is called, in the building thread, just
    before a build that is not cached (tens of seconds; the CLI prints a line to say so)."""

    def __init__(self, limits: GuestLimits | None = None, *, host: WasmHost | None = None,
                 on_build: Callable[[], None] | None = None) -> None:
        self.limits = limits or GuestLimits()
        self._host = host
        self._host_lock = asyncio.Lock()
        self._on_build = on_build
        self._js_hosts: dict[Path, WasmHost] = {}

    def start(self, engine: Engine, manifest: Manifest, args: dict[str, Any], instance: HostInstance) -> asyncio.Task[Event]:
        coro = self._run(manifest, args, instance)
        return asyncio.get_running_loop().create_task(coro, name=f"pie-wasm-{manifest.name}-{instance.id}")

    async def host(self) -> WasmHost:
        """The compiled component (built and compiled in a thread on first use)."""
        async with self._host_lock:
            if self._host is None:
                from pie_core.models.weights_cache import cache_dir

                cache, on_build = cache_dir(), self._on_build
                self._host = await asyncio.to_thread(lambda: WasmHost(component_path(cache, on_build=on_build)))
            return self._host

    async def js_host(self, manifest: Manifest) -> WasmHost:
        """The compiled component of a JS inferlet: bundled and built on first use (cached by
        content hash on disk, compiled once per launcher)."""
        from pie_core.models.weights_cache import cache_dir

        async with self._host_lock:
            cache, on_build = cache_dir(), self._on_build

            def build() -> WasmHost:
                path = js_component_path(manifest.root, manifest.entry, cache, on_build=on_build)
                host = self._js_hosts.get(path)
                if host is None:
                    if len(self._js_hosts) >= _MAX_JS_HOSTS:
                        self._js_hosts.pop(next(iter(self._js_hosts)))
                    host = self._js_hosts[path] = WasmHost(path, python=False)
                return host

            return await asyncio.to_thread(build)

    async def aclose(self) -> None:
        """Nothing to stop: each instance's thread ends with it."""

    async def _run(self, manifest: Manifest, args: dict[str, Any], inst: HostInstance) -> Event:
        if inst.resolve_program is None:  # no resolver from the server: spawn finds folders and examples by name
            inst.resolve_program = find_program
        token = bind(inst)
        final = Event("error", "cancelled")
        try:
            try:
                final = await self._launch(manifest, args, inst)
            except asyncio.CancelledError as exc:
                final = Event("error", f"cancelled: {exc.args[0]}" if exc.args and exc.args[0] else "cancelled")
                raise
            except Exception as exc:  # noqa: BLE001 - the instance failed: its reason is the event
                final = Event("error", f"{type(exc).__name__}: {exc}")
            return final
        finally:
            inst.release_all()
            unbind(token)
            inst.emit(final)

    async def _launch(self, manifest: Manifest, args: dict[str, Any], inst: HostInstance) -> Event:
        payload = manifest.validate_input(args)
        host = await (self.js_host(manifest) if is_js_entry(manifest.entry) else self.host())
        scratch = host_runtime.scratch_dir()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        ended: asyncio.Future[None] = loop.create_future()  # the thread left host.run: store and memory freed
        request = {"entry": manifest.entry, "input": payload}
        cancelled = threading.Event()

        def guest() -> None:
            try:
                result = host.run(manifest.root, scratch, request, inst, loop, self.limits, runner=self._run,
                                  cancelled=cancelled)
                if result.ok:
                    result.value = _jsonable(result.value)  # here, not on the loop: it walks the whole value
                loop.call_soon_threadsafe(lambda r=result: done.done() or done.set_result(r))
            except BaseException as exc:  # noqa: BLE001 - never leave the task waiting
                loop.call_soon_threadsafe(lambda e=exc: done.done() or done.set_exception(e))
            finally:
                try:
                    loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(None))
                except RuntimeError:  # the loop is closed: nobody waits
                    pass

        threading.Thread(target=guest, name=f"pie-wasm-{inst.id}", daemon=True).start()
        try:
            result = await done
        except asyncio.CancelledError:
            cancelled.set()  # it traps at the next epoch tick; a wait in the host ends at once
            await _freed(ended, inst.id)  # the process counts (quotas, list) until its thread and store are gone
            raise
        await _freed(ended, inst.id)
        if result.ok:
            return Event("return", result.value)
        why = str(result.value)
        return Event("error", why if len(why) <= _MAX_ERROR else why[:_MAX_ERROR] + " [...]")


async def _freed(ended: asyncio.Future[None], instance_id: Any) -> None:
    """Wait until a cancelled guest's thread ended, through further cancellations."""
    deadline = time.monotonic() + _FREE_GRACE_S
    while not ended.done() and time.monotonic() < deadline:
        try:
            await asyncio.wait_for(asyncio.shield(ended), deadline - time.monotonic())
        except asyncio.CancelledError:
            continue
        except asyncio.TimeoutError:
            break
    if not ended.done():
        _log.warning("wasm instance %s still runs %ss after it was cancelled", instance_id, _FREE_GRACE_S)


async def run_wasm(engine: Engine, manifest: Manifest, args: dict[str, Any], instance: HostInstance,
                   limits: GuestLimits | None = None, on_build: Callable[[], None] | None = None) -> Event:
    """Run one inferlet in the sandbox to its end (``pie run --isolation wasm``); ``on_build`` as
    for :class:`WasmLauncher`.

    Raises:
        Unsupported: The wasm toolchain is not installed (the message says what to install).
    """
    missing = wasm_missing(manifest)
    if missing:
        raise Unsupported(missing)
    return await WasmLauncher(limits, on_build=on_build).start(engine, manifest, args, instance)


def wasm_missing(manifest: Manifest) -> str | None:
    """Why ``manifest``'s inferlet cannot run in the sandbox here (a one-line fix), or None."""
    if not is_js_entry(manifest.entry):
        return toolchain_missing()
    try:
        metadata.version("wasmtime")
    except metadata.PackageNotFoundError:
        return "the wasm runner needs wasmtime, which is not installed: pip install 'pie-engine[wasm]'"
    return js_toolchain_missing()


class JsInWasm:
    """A launcher that runs JS/TS inferlets in the wasm sandbox (they run nowhere else) and
    every other inferlet with ``inner`` (``pie serve --isolation inprocess|process``)."""

    def __init__(self, inner: Any, limits: GuestLimits, on_build: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self._wasm = WasmLauncher(limits, on_build=on_build)

    def start(self, engine: Engine, manifest: Manifest, args: dict[str, Any], instance: HostInstance) -> asyncio.Task[Event]:
        launcher = self._wasm if is_js_entry(manifest.entry) else self.inner
        return launcher.start(engine, manifest, args, instance)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def aclose(self) -> None:
        await self.inner.aclose()
