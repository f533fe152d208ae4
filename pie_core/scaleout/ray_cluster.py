"""Joining a Ray cluster, or starting a small one on this machine, for replicas on Ray."""

from __future__ import annotations

import os
from types import ModuleType

from pie_core.errors import InvalidInput, Unsupported

__all__ = ["LOCAL", "MISSING_RAY", "LOCAL_OBJECT_STORE_BYTES", "connect", "import_ray"]

LOCAL = "local"
"""The address that starts a Ray on this machine (Ray's own meaning of ``address="local"``)."""

MISSING_RAY = "pie serve --ray needs Ray: pip install 'pie-engine[ray]'"

LOCAL_OBJECT_STORE_BYTES = 256 << 20
"""The object store of a Ray this process starts: batches and outputs are small (most go inline
in the call), so it need not take Ray's default of 30% of memory."""


def import_ray() -> ModuleType:
    """The ``ray`` package.

    Raises:
        Unsupported: Ray is not installed (the message says what to install).
    """
    try:
        import ray
    except ImportError:
        raise Unsupported(MISSING_RAY) from None
    return ray


def connect(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Connect this process to Ray, unless it already is.

    Args:
        address: A cluster's address (``auto``, ``host:6379``, ``ray://host:10001``); ``local``
            starts a Ray here; None reads ``RAY_ADDRESS`` and starts one here when it is unset.
        num_cpus: CPUs a Ray started here offers (None: the machine's, and at least one per CPU
            replica the caller will start, so none waits for a CPU that never frees).

    Returns:
        True when this call started or joined Ray (the caller shuts it down when done); False
        when the process was connected already.

    Raises:
        Unsupported: Ray is not installed.
        InvalidInput: No Ray cluster answers at ``address``.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or LOCAL
    if address == LOCAL:
        ray.init(address=LOCAL, num_cpus=num_cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (SystemExit, ConnectionError) as exc:  # Ray exits (code 15) when no GCS answers at the address
            raise InvalidInput(f"cannot join the Ray cluster at {address!r} ({type(exc).__name__} {exc}): is it "
                               "running? 'ray status' on its head node says; or leave out --ray-address and "
                               "RAY_ADDRESS to start a Ray here") from None
    return True
