"""A tensor-parallel group: rank 0 (the engine's process) and the worker processes it starts.

Rank 0 starts one ``python -m pie_backend_torch.tp_worker`` per extra rank, hosts a
``TCPStore`` on a free port of 127.0.0.1 (the rendezvous), and talks to the workers over two
process groups built on it: *control* (gloo, CPU tensors: every command rank 0 broadcasts, and
the weights it sends each rank) and *compute* (the all-reduces inside the forward: the same gloo
group on a CPU, NCCL on CUDA). The whole group lives and dies together: every wait on another
rank is bounded by ``timeout``, and the first failure (a rank that exited, a collective that
timed out) breaks the group for good; every later call raises the same one-line
``RuntimeError`` naming the rank. Workers stop on :meth:`TpGroup.close`, when rank 0's process
exits (``atexit``), or when it is garbage-collected.
"""

from __future__ import annotations

import datetime
import os
import pickle
import subprocess
import sys
import time
import weakref
from typing import Any, Sequence

import torch
import torch.distributed as dist

__all__ = ["TpGroup", "Channel", "connect_worker"]

_IDLE = datetime.timedelta(days=365)
"""How long a worker waits for rank 0's next command (an idle engine is not a failure)."""
LOAD_TIMEOUT = 600.0
"""Least seconds a load may wait on another rank (a worker starts Python and torch, then
receives and lays out its weights): ``tp_timeout`` bounds the steps, not this."""


class Channel:
    """One rank's end of the control and compute groups."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: float, device: torch.device) -> None:
        self.rank, self.size = rank, size
        self.timeout = datetime.timedelta(seconds=timeout)
        self.load_timeout = datetime.timedelta(seconds=max(timeout, LOAD_TIMEOUT))
        # the groups' own default is the load's; every step's wait passes ``timeout`` itself
        self.control: Any = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, size, self.load_timeout)  # stubs lack its ops
        self.compute: Any = self.control
        if device.type == "cuda":  # same calls, NCCL underneath (not run in CI: no GPU there)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.load_timeout
            self.compute = dist.ProcessGroupNCCL(dist.PrefixStore("compute", store), rank, size, options)

    def all_reduce(self, tensor: torch.Tensor, loading: bool = False) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place (``loading``: within the load's time limit)."""
        timeout = self.load_timeout if loading else self.timeout
        options = dist.AllreduceOptions()
        options.timeout = timeout
        self.compute.allreduce([tensor], options).wait(timeout)
        return tensor

    def broadcast_object(self, obj: Any = None, idle: bool = False) -> Any:
        """Rank 0's ``obj`` on every rank (pickled). ``idle``: wait as long as it takes for it."""
        timeout = _IDLE if idle else self.timeout
        if self.rank == 0:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            header = torch.tensor([len(data)], dtype=torch.int64)
        else:
            header = torch.zeros(1, dtype=torch.int64)
        self.control.broadcast(header, 0, timeout).wait(timeout)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.rank == 0 else torch.empty(int(header[0]), dtype=torch.uint8)
        self.control.broadcast(payload, 0, self.timeout).wait(self.timeout)
        return obj if self.rank == 0 else pickle.loads(payload.numpy().tobytes())

    def send_object(self, obj: Any, dst: int) -> None:
        """Send ``obj`` to one rank (the load's weights: within the load's time limit)."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.control.send([torch.tensor([len(data)], dtype=torch.int64)], dst, 0).wait(self.load_timeout)
        self.control.send([torch.frombuffer(bytearray(data), dtype=torch.uint8)], dst, 1).wait(self.load_timeout)

    def recv_object(self, src: int = 0) -> Any:
        header = torch.zeros(1, dtype=torch.int64)
        self.control.recv([header], src, 0).wait(self.load_timeout)
        payload = torch.empty(int(header[0]), dtype=torch.uint8)
        self.control.recv([payload], src, 1).wait(self.load_timeout)
        return pickle.loads(payload.numpy().tobytes())


def connect_worker(port: int, rank: int, size: int, timeout: float, device: torch.device) -> Channel:
    """A worker's end: join rank 0's store, say it is up, and build the groups."""
    store = dist.TCPStore("127.0.0.1", port, size, False, datetime.timedelta(seconds=max(timeout, LOAD_TIMEOUT)))
    store.set(f"up/{rank}", str(os.getpid()))
    return Channel(store, rank, size, timeout, device)


def _stop(procs: Sequence[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """End the workers (terminate, then kill what is left after ``grace`` seconds); reap them."""
    for p in procs:
        if p.poll() is None:
            p.terminate() if grace > 0 else p.kill()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class TpGroup:
    """Rank 0's side: starts the workers, broadcasts commands, and notices when a rank is gone.

    Args:
        size: Ranks in all (this process included), >= 2.
        device: Rank 0's device; rank ``r`` runs on ``cuda:(index + r)`` when it is CUDA.
        timeout: Seconds any wait on another rank may take.

    Raises:
        RuntimeError: A worker did not start or join within ``timeout`` (its exit code named).
    """

    def __init__(self, size: int, device: torch.device, timeout: float) -> None:
        self.size = size
        self.failed: str | None = None
        self._timeout = timeout
        self._load_timeout = max(timeout, LOAD_TIMEOUT)
        store = dist.TCPStore(
            "127.0.0.1", 0, size, True, datetime.timedelta(seconds=self._load_timeout), wait_for_workers=False
        )
        self.port = int(store.port)
        base = device.index or 0
        self.procs: list[subprocess.Popen[bytes]] = []
        for r in range(1, size):
            dev = f"cuda:{base + r}" if device.type == "cuda" else "cpu"
            cmd = [sys.executable, "-m", "pie_backend_torch.tp_worker", str(self.port), str(r), str(size), str(timeout), dev]
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=_worker_env()))
        self._finalizer = weakref.finalize(self, _stop, self.procs)  # also runs at interpreter exit
        try:
            self._await_workers(store)
            self.channel = Channel(store, 0, size, timeout, device)
        except BaseException:
            self.close()
            raise
        self._store = store

    def _await_workers(self, store: dist.Store) -> None:
        deadline = time.monotonic() + self._load_timeout
        for r, p in enumerate(self.procs, start=1):
            while not store.check([f"up/{r}"]):
                if p.poll() is not None:
                    raise RuntimeError(f"tensor-parallel rank {r} exited with code {p.returncode} while starting (its stderr has why)")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel rank {r} did not join within {self._load_timeout:g} s")
                time.sleep(0.02)

    def check(self) -> None:
        """Raise if the group is broken or a worker has exited (a cheap poll of each process).

        Raises:
            RuntimeError: One line naming the rank.
        """
        if self.failed is not None:
            raise RuntimeError(self.failed)
        gone = self._exited()
        if gone is not None:
            raise self._fail(gone)

    def _exited(self) -> str | None:
        for r, p in enumerate(self.procs, start=1):
            if p.poll() is not None:
                return f"tensor-parallel rank {r} (pid {p.pid}) exited with code {p.returncode}"
        return None

    def _fail(self, why: str) -> RuntimeError:
        self.failed = f"{why}; the model's tensor-parallel group is gone: load the model again"
        _stop(self.procs, grace=0.0)  # a broken group has nothing to finish: no rank is waited for
        return RuntimeError(self.failed)

    def guard(self, exc: BaseException) -> RuntimeError:
        """The one-line error for ``exc``, raised by a collective: names the rank that exited when
        one did (waiting up to a second for it to be reaped), else says the wait failed."""
        if self.failed is not None:
            return RuntimeError(self.failed)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            gone = self._exited()
            if gone is not None:
                return self._fail(gone)
            time.sleep(0.02)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        limits = f"tp_timeout {self._timeout:g} s a step, {self._load_timeout:g} s a load"
        return self._fail(f"a tensor-parallel rank did not answer in time ({limits}; {first[:160]})")

    def all_reduce(self, tensor: torch.Tensor, loading: bool = False) -> torch.Tensor:
        """Sum over the ranks (the forward's reduction), with a failure turned into :meth:`guard`'s error."""
        try:
            return self.channel.all_reduce(tensor, loading)
        except Exception as exc:
            raise self.guard(exc) from None

    def command(self, *message: Any) -> None:
        """Broadcast one command to the workers.

        Raises:
            RuntimeError: The group is broken or a rank is gone.
        """
        self.check()
        try:
            self.channel.broadcast_object(message)
        except Exception as exc:
            raise self.guard(exc) from None

    def send(self, rank: int, obj: Any) -> None:
        """Send ``obj`` to one worker (load's weights)."""
        try:
            self.channel.send_object(obj, rank)
        except Exception as exc:
            raise self.guard(exc) from None

    def close(self) -> None:
        """Tell the workers to stop and reap them (killing any that linger). Idempotent."""
        if self.failed is None and hasattr(self, "channel") and all(p.poll() is None for p in self.procs):
            try:
                self.channel.broadcast_object(("close",))
            except Exception:
                pass  # they are stopped below either way
        self.failed = self.failed or "the model's tensor-parallel group was closed: load it again"
        self._finalizer()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


def _worker_env() -> dict[str, str]:
    """This process's environment, with its ``sys.path`` on ``PYTHONPATH`` so a worker imports the
    same packages (an editable or path-based install included)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env
