"""The decode-graph logic (static buffers, bucket padding into the scratch page, row picking) gives
the eager forward's logits. Capture is replaced by a plain call, so this runs on a CPU through the
Triton interpreter; actual CUDA graph capture needs a GPU and is not exercised here."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")  # xgrammar brings it to every install

from backend_testkit import kv_request, probe_logits, run  # noqa: E402
from pie_backend_torch.cuda_graphs import DecodeGraphs, EagerCapture  # noqa: E402
from pie_core.hookspec import ProbeKind  # noqa: E402
from pie_core.backend_kit.sampling import hidden_rows, logit_rows  # noqa: E402
from pie_core.scheduler.assemble import assemble  # noqa: E402
from pie_core.scheduler.request import ProbeSpec  # noqa: E402
from torch_testkit import load_torch, spec_of  # noqa: E402

PAGE = 4


def _graphed(spec, max_pages: int = 8):
    backend = load_torch(spec, page_size=PAGE, kv_pages=64, kernels="triton")
    backend._graphs = DecodeGraphs(backend._model, EagerCapture(), max_pages=max_pages)
    return backend


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_graphed_decode_steps_equal_eager_steps(arch):
    spec = spec_of(arch)
    graphed, eager = _graphed(spec), load_torch(spec, page_size=PAGE, kv_pages=64, kernels="triton")
    rng = np.random.default_rng(0)
    pages = [[1, 2, 3], [9, 4], [20, 21, 22, 23, 24], [30], [40, 41]]
    lengths = [9, 6, 17, 2, 5]
    prefill = [kv_request(rng.integers(0, spec.vocab_size, n).tolist(), p, PAGE) for n, p in zip(lengths, pages)]
    run(graphed, prefill), run(eager, prefill)
    for members in ([0, 1, 2], [3], [0, 1, 2, 3, 4], [4, 2]):  # buckets 4 (padded), 1, 8 (padded), 2
        reqs = []
        for i in members:
            reqs.append(kv_request([int(rng.integers(spec.vocab_size))], pages[i], PAGE, start=lengths[i]))
            lengths[i] += 1
        want = probe_logits(run(eager, reqs), reqs)
        got = probe_logits(run(graphed, reqs), reqs)
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    assert sorted(graphed._graphs.steps) == [1, 2, 4, 8]


def test_only_plain_decode_steps_take_the_graph():
    spec = spec_of("qwen2")
    graphs = _graphed(spec, max_pages=2)._graphs

    def accepts(reqs):
        batch = assemble(reqs, spec.vocab_size)
        return graphs.accepts(batch, logit_rows(batch), hidden_rows(batch))

    assert accepts([kv_request([1], [0, 1], PAGE, start=5), kv_request([2], [3], PAGE, start=0)])
    assert not accepts([kv_request([1, 2], [0], PAGE)])  # prefill
    assert not accepts([kv_request([1], [0, 1], PAGE, start=5, mask=np.ones((1, 6), bool))])
    assert not accepts([kv_request([1], [0, 1, 2], PAGE, start=9)])  # more pages than captured
    embed = (ProbeSpec(index=0, kind=ProbeKind.EMBEDDING),)
    assert not accepts([kv_request([1], [0], PAGE, probes=embed, probe_all=False)])
    assert not accepts([kv_request([1], [0], PAGE, probe_all=False)])  # nothing to read


def test_the_scratch_page_is_not_addressable():
    backend = _graphed(spec_of("qwen2"))
    caps = backend.pie_backend_capabilities()
    assert backend._cache.scratch_page == caps.num_pages
    with pytest.raises(ValueError, match="out of range"):
        backend.pie_backend_copy_pages(0, np.array([caps.num_pages]), np.array([0]))


def test_a_graphed_step_writes_its_slot_positions_into_the_device_pool():
    import torch

    spec = spec_of("qwen2")
    backend = _graphed(spec)
    cache = backend._cache
    cache.device.pos = torch.full_like(cache.device.pos, -1)  # apart from the host mirror, as on a GPU
    reqs = [kv_request([5], [3, 7], PAGE, start=6), kv_request([9], [12], PAGE, start=2)]  # bucket 2
    run(backend, reqs)
    pos = cache.device.pos
    assert int(pos[7, 2]) == 6 and int(pos[12, 2]) == 2  # slot (page, offset) of position 6 and 2
    assert int((pos[: cache.scratch_page] >= 0).sum()) == 2  # nothing else written (padding: the scratch page)
