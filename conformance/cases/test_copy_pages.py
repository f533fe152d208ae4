"""Page copies carry every layer's K and V (and slot positions) in each declared direction."""

from __future__ import annotations

import numpy as np
import pytest

from pie_core.hookspec import CopyKind

from conformance.batches import kv_request
from conformance.loaded import LoadedModel

SURFACE = "copy_pages"


def _directions(model: LoadedModel) -> list[CopyKind]:
    kinds = [CopyKind.DEVICE_TO_DEVICE]
    if "offload" in model.features:
        kinds += [CopyKind.DEVICE_TO_HOST, CopyKind.HOST_TO_DEVICE]
    return kinds


def _prefill(model: LoadedModel, rng: np.random.Generator, pages: list[int]) -> int:
    p = model.page_size
    length = 2 * p + 3
    mine, ref = model.both([kv_request(rng.integers(0, model.vocab, length), pages, p)])
    model.assert_close(mine, ref, "prefill before the copy")
    return length


def test_device_to_device_copy_carries_the_kv(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    src = numeric.pages_for(2 * p + 5)
    dst = numeric.pages(len(src))
    length = _prefill(numeric, rng, src)
    numeric.copy_both(CopyKind.DEVICE_TO_DEVICE, src, dst)
    nxt = rng.integers(0, numeric.vocab, 2)
    mine, ref = numeric.both([kv_request(nxt, dst, p, start=length)])
    numeric.assert_close(mine, ref, f"continuing on the copies {dst} of pages {src}")
    mine, ref = numeric.both([kv_request(nxt, src, p, start=length)])
    numeric.assert_close(mine, ref, "continuing on the source pages after the copy")


def test_device_host_round_trip_carries_the_kv(numeric: LoadedModel, rng: np.random.Generator) -> None:
    numeric.require("offload")
    p = numeric.page_size
    src = numeric.pages_for(2 * p + 4)
    host, back = numeric.host_pages(len(src)), numeric.pages(len(src))
    length = _prefill(numeric, rng, src)
    numeric.copy_both(CopyKind.DEVICE_TO_HOST, src, host)
    numeric.both([kv_request(rng.integers(0, numeric.vocab, len(src) * p), src, p)])  # overwrite the originals
    numeric.copy_both(CopyKind.HOST_TO_DEVICE, host, back)
    mine, ref = numeric.both([kv_request(rng.integers(0, numeric.vocab, 1), back, p, start=length)])
    numeric.assert_close(mine, ref, f"continuing on pages {back} restored from host pages {host}")


def test_copy_refuses_mismatched_lengths(model: LoadedModel) -> None:
    with pytest.raises(Exception):
        model.copy_pages(CopyKind.DEVICE_TO_DEVICE, model.pages(2), model.pages(1))


@pytest.mark.parametrize("kind", list(CopyKind), ids=lambda k: k.name.lower())
def test_copy_refuses_ids_outside_the_pool(model: LoadedModel, kind: CopyKind) -> None:
    if kind not in _directions(model):
        model.require("offload")
    device, host = model.caps.num_pages, model.caps.num_host_pages
    src_limit, dst_limit = {
        CopyKind.DEVICE_TO_DEVICE: (device, device),
        CopyKind.DEVICE_TO_HOST: (device, host),
        CopyKind.HOST_TO_DEVICE: (host, device),
    }[kind]
    with pytest.raises(Exception):
        model.copy_pages(kind, [src_limit], [0])
    with pytest.raises(Exception):
        model.copy_pages(kind, [0], [dst_limit])
    with pytest.raises(Exception):
        model.copy_pages(kind, [-1], [0])
