"""A tensor-parallel worker: rank ``r`` > 0 of a model loaded with ``tp`` > 1.

Started by :class:`pie_backend_torch.tp_group.TpGroup` as
``python -m pie_backend_torch.tp_worker PORT RANK SIZE TIMEOUT DEVICE``. It joins rank 0's store,
then runs the commands rank 0 broadcasts, in order, until ``close``:

- ``("load", spec, config, page_size, num_pages, host_pages, threads)``: receive this rank's
  slice of every weight (then ``None``), build its model and KV pools, and join the all-reduce
  that tells rank 0 every rank is ready;
- ``("forward", batch)``: the same forward as rank 0 over its slice (no LM head, no sampling);
- ``("copy", kind, src, dst)``: the same page copy in its own pools;
- ``("adapter", method, *args)``: the same change to its adapter bank (create, load, destroy,
  zo), whose forward fuses this rank's slice of each adapter.

A ``ValueError`` of a forward is the batch's fault and rank 0 raised it too, before any
collective, so the worker goes on; anything else ends the process with one line on stderr,
which rank 0 then reports as the rank's exit.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from pie_backend_torch.tp_group import Channel, connect_worker

__all__ = ["main"]


def _serve(channel: Channel) -> None:
    from pie_backend_torch.adapters import AdapterStore
    from pie_backend_torch.backend import build_transformer
    from pie_backend_torch.model import Transformer
    from pie_backend_torch.tp_shard import Shard, local_spec

    model: Transformer | None = None
    adapters: AdapterStore | None = None
    no_rows = np.zeros(0, dtype=np.int64)
    while True:
        message = channel.broadcast_object(idle=True)
        command = message[0]
        if command == "close":
            return
        if command == "load":
            spec, config, page_size, num_pages, host_pages, threads = message[1:]
            if threads is not None:
                torch.set_num_threads(threads)
            weights = []
            while (item := channel.recv_object()) is not None:
                weights.append(item)
            local = local_spec(spec, config.tp)
            model = build_transformer(local, weights, config, page_size, num_pages, host_pages, channel.all_reduce)
            adapters = AdapterStore(spec, config.kernels, config.dtype, config.device, Shard(spec, channel.rank, config.tp))
            channel.all_reduce(torch.ones(1, device=config.device), loading=True)
        elif model is None or adapters is None:
            raise RuntimeError(f"command {command!r} before any load")
        elif command == "forward":
            try:
                with torch.inference_mode():
                    model.forward(message[1], no_rows, None, adapters.step(message[1]))
            except ValueError:
                pass  # the batch's own fault: rank 0 raised the same
        elif command == "adapter":  # rank 0 made the same change first: it succeeds here too
            getattr(adapters, message[1])(*message[2:])
        elif command == "copy":
            with torch.inference_mode():
                model.cache.copy(*message[1:])
        else:
            raise RuntimeError(f"unknown command {command!r}")


def main(argv: list[str]) -> int:
    port, rank, size, timeout, device = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3]), torch.device(argv[4])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        _serve(connect_worker(port, rank, size, timeout, device))
    except Exception as exc:  # one line: rank 0 names the rank and its exit code
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"pie tensor-parallel rank {rank}: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
