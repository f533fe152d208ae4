"""Run the inferlet at ``/inferlet``: import its entry, drive ``main(input)`` on the guest loop.

The guest runs one inferlet, so the inferlet may block: its transport lets the SDK's synchronous
forms run their waits on guest loops of their own, and a plain ``def main(input)`` is called
with no loop running, so the SDK's waiting calls return values."""

import asyncio
import inspect
import json
import sys

from componentize_py_types import Err

from inferlet.host.entry import MAIN_EXITS, exit_outcome
from inferlet.host import entry
from pie_guest import clock, stdio
from pie_guest.loop import GuestLoop
from pie_guest.transport import WitTransport

__all__ = ["run"]

ROOT = "/inferlet"
TRANSPORT = WitTransport()  # built at build time, into the snapshot


def run(request: str) -> str:
    """``request`` is ``{"entry": ..., "input": ...}`` as JSON; returns ``main``'s value as JSON.

    Raises:
        Err: The inferlet could not be loaded, or ``main`` raised; the text says why.
    """
    try:
        stdio.install(TRANSPORT)
        clock.install()
        first = json.loads(request)
        entry.install(TRANSPORT)
        main = entry.load_main(f"{ROOT}/{first['entry']}", "_pie_inferlet", synchronous=True, own_process=True)
        if inspect.iscoroutinefunction(main):
            loop = GuestLoop()
            asyncio.set_event_loop(loop)
            try:
                value = loop.run_until_complete(main(first["input"]))
            finally:
                loop.close()
        else:
            value = main(first["input"])
        return entry.encode_return(value)
    except MAIN_EXITS as exc:  # sys.exit() / KeyboardInterrupt: the run's end, as in every runner
        kind, value = exit_outcome(exc)
        if kind == "return":
            return entry.encode_return(value)
        raise Err(value) from None
    except BaseException as exc:  # noqa: BLE001 - everything becomes the error the host reports
        raise Err(entry.describe(exc)) from None
    finally:
        _flush()


def _flush():
    """Send the partial stdout line; a failure (the inferlet was cancelled) must not hide how
    ``main`` ended."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
