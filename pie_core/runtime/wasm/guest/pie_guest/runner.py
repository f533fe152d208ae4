"""Run the inferlet at ``/inferlet``: import its entry, drive ``main(input)`` on the guest loop.

The guest runs one inferlet, so the inferlet may block: the SDK's synchronous forms
(:mod:`inferlet._blocking`) run their waits on guest loops of their own, and a plain
``def main(input)`` is called with no loop running, so the SDK's waiting calls return values."""

import asyncio
import importlib.util
import inspect
import json
import sys

from componentize_py_types import Err

from inferlet import _blocking
from inferlet._return_value import encode_return
from pie_guest.loop import GuestLoop

__all__ = ["run"]

ROOT = "/inferlet"


def run(request: str) -> str:
    """``request`` is ``{"entry": ..., "input": ...}`` as JSON; returns ``main``'s value as JSON.

    Raises:
        Err: The inferlet could not be loaded, or ``main`` raised; the text says why.
    """
    try:
        sys.stdout.reconfigure(line_buffering=True)
        first = json.loads(request)
        _blocking.install(GuestLoop)
        main = _load(first["entry"])
        if inspect.iscoroutinefunction(main):
            loop = GuestLoop()
            asyncio.set_event_loop(loop)
            try:
                value = loop.run_until_complete(main(first["input"]))
            finally:
                loop.close()
        else:
            value = main(first["input"])
        return encode_return(value)
    except BaseException as exc:  # noqa: BLE001 - everything becomes the error the host reports
        raise Err(f"{type(exc).__name__}: {exc}") from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _load(entry: str):
    path = f"{ROOT}/{entry}"
    spec = importlib.util.spec_from_file_location("_pie_inferlet", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {entry}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, ROOT)
    spec.loader.exec_module(module)
    main = getattr(module, "main", None)
    if main is None or not callable(main):
        raise TypeError(f"{entry} must define 'async def main(input)' (or 'def main(input)')")
    return main
