"""Batch assembly and output splitting on multi-request batches: every field lands in its
request's slice of the flat batch, and every sampled token and probe value goes back to the
request (and the sample) that asked for it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pie_core.backend import BackendWorker, FunctionBackend
from pie_core.errors import BackendError
from pie_core.hookspec import BatchOutput, Capabilities, ForwardBatch
from pie_core.scheduler.assemble import assemble, split_output
from pie_core.scheduler.batcher import Batcher
from pie_core.scheduler.request import ForwardRequest
from pie_core.values import ProbeKind, ProbeSpec, SamplerKind, SampleSpec

VOCAB = 21  # not a multiple of 8: the packed logit mask ends mid-byte
PS = 4


def _mask_row(allowed: list[int]) -> np.ndarray:
    bits = np.zeros(VOCAB, dtype=bool)
    bits[allowed] = True
    return np.packbits(bits, bitorder="little")


def _request(n: int, first_token: int, pages: list[int], kv_len: int, mask: bool, samples=(), probes=(),
             adapter: int = -1, zo: int = 0) -> ForwardRequest:
    rng = np.random.default_rng(first_token)
    return ForwardRequest(
        token_ids=np.arange(first_token, first_token + n, dtype=np.int32),
        positions=np.arange(kv_len - n, kv_len, dtype=np.int32),
        page_ids=np.asarray(pages, dtype=np.int32),
        last_page_len=kv_len - (len(pages) - 1) * PS,
        write_slots=np.arange(kv_len - n, kv_len, dtype=np.int32),
        attention_mask=rng.random((n, kv_len)) < 0.5 if mask else None,
        samples=tuple(samples),
        probes=tuple(probes),
        adapter_id=adapter,
        zo_seed=zo,
    )


def _three_requests() -> list[ForwardRequest]:
    """Request 0: causal, one argmax sample. Request 1: a 3x9 custom mask, a multinomial
    sample of 3 draws and a masked argmax sample, a probe masked by its second sample.
    Request 2: a 2x6 custom mask, one sample with 2 draws, two probes (one raw, one masked)."""
    return [
        _request(3, 10, [7], 3, mask=False, samples=[SampleSpec(index=2)]),
        _request(
            3, 20, [2, 5, 9], 9, mask=True,
            samples=[
                SampleSpec(index=0, kind=SamplerKind.MULTINOMIAL, draws=3, seed=11, temperature=0.5),
                SampleSpec(index=2, logit_mask=_mask_row([1, 4, 20])),
            ],
            probes=[ProbeSpec(index=1, kind=ProbeKind.LOGPROBS, token_ids=(3, 4)),
                    ProbeSpec(index=2, kind=ProbeKind.DISTRIBUTION, k=5, masked_by=1)],
            adapter=3, zo=99,
        ),
        _request(
            2, 30, [0, 1], 6, mask=True,
            samples=[SampleSpec(index=1, kind=SamplerKind.MULTINOMIAL, draws=2, top_k=4, logit_mask=_mask_row([0, 8]))],
            probes=[ProbeSpec(index=0, kind=ProbeKind.ENTROPY),
                    ProbeSpec(index=1, kind=ProbeKind.LOGITS, masked_by=0)],
        ),
    ]


def test_assembly_puts_each_requests_tokens_pages_and_masks_in_its_slice():
    reqs = _three_requests()
    batch = assemble(reqs, VOCAB)
    assert batch.qo_indptr.tolist() == [0, 3, 6, 8]
    assert batch.token_ids.tolist() == [10, 11, 12, 20, 21, 22, 30, 31]
    assert batch.kv_page_indptr.tolist() == [0, 1, 4, 6]
    assert batch.kv_page_indices.tolist() == [7, 2, 5, 9, 0, 1]
    assert batch.kv_last_page_len.tolist() == [3, 1, 2]
    assert batch.kv_write_slots.tolist() == [0, 1, 2, 6, 7, 8, 4, 5]
    assert batch.positions.tolist() == [0, 1, 2, 6, 7, 8, 4, 5]
    assert batch.adapter_ids.tolist() == [-1, 3, -1] and batch.zo_seeds.tolist() == [0, 99, 0]
    # masks of different sizes: request 0 has none, 1 is 3x9, 2 is 2x6
    assert batch.mask_indptr.tolist() == [0, 0, 27, 39]
    for r, req in enumerate(reqs):
        lo, hi = batch.mask_indptr[r], batch.mask_indptr[r + 1]
        if req.attention_mask is None:
            assert lo == hi
        else:
            np.testing.assert_array_equal(batch.mask_data[lo:hi].reshape(req.attention_mask.shape), req.attention_mask)


def test_assembly_numbers_sample_and_probe_rows_across_requests():
    batch = assemble(_three_requests(), VOCAB)
    assert batch.sample_rows.tolist() == [2, 3, 5, 7]  # request-relative index + request start
    assert batch.draws.tolist() == [1, 3, 1, 2]
    assert batch.sampler_kind.tolist() == [SamplerKind.ARGMAX, SamplerKind.MULTINOMIAL, SamplerKind.ARGMAX,
                                           SamplerKind.MULTINOMIAL]
    assert batch.seeds.tolist() == [0, 11, 0, 0] and batch.top_k.tolist() == [0, 0, 0, 4]
    np.testing.assert_allclose(batch.temperature, [1.0, 0.5, 1.0, 1.0])
    # logit masks: rows without one allow everything; the others are the request's own bytes
    assert batch.logit_masks is not None and batch.logit_masks.shape == (4, (VOCAB + 7) // 8)
    assert (batch.logit_masks[[0, 1]] == 0xFF).all()
    np.testing.assert_array_equal(batch.logit_masks[2], _mask_row([1, 4, 20]))
    np.testing.assert_array_equal(batch.logit_masks[3], _mask_row([0, 8]))
    assert batch.probe_rows.tolist() == [4, 5, 6, 7]
    # masked_by is an index into the request's samples; the batch names the global sample row
    assert batch.probe_masked.tolist() == [-1, 2, -1, 3]
    assert batch.probe_token_indptr.tolist() == [0, 2, 2, 2, 2] and batch.probe_token_ids.tolist() == [3, 4]
    assert batch.probe_kind.tolist() == [ProbeKind.LOGPROBS, ProbeKind.DISTRIBUTION, ProbeKind.ENTROPY, ProbeKind.LOGITS]


def _tagged_output(batch: ForwardBatch) -> BatchOutput:
    """Token ``100 * sample_row + draw`` for each draw; probe value ``("probe", probe_row)``."""
    tokens = [100 * int(row) + d for row, n in zip(batch.sample_rows, batch.draws) for d in range(n)]
    return BatchOutput(tokens=np.asarray(tokens, dtype=np.int32),
                       probes=tuple(("probe", int(row)) for row in batch.probe_rows))


def test_split_output_gives_each_request_its_draws_and_probes():
    reqs = _three_requests()
    batch = assemble(reqs, VOCAB)
    out = split_output(reqs, batch, _tagged_output(batch))
    assert [o.tokens for o in out] == [
        ((200,),),
        ((300, 301, 302), (500,)),
        ((700, 701),),
    ]
    assert [o.probes for o in out] == [(), (("probe", 4), ("probe", 5)), (("probe", 6), ("probe", 7))]


@pytest.mark.parametrize("extra_tokens, extra_probes", [(1, 0), (-1, 0), (0, 1), (0, -1)])
def test_split_output_refuses_a_backend_that_returns_the_wrong_count(extra_tokens, extra_probes):
    reqs = _three_requests()
    batch = assemble(reqs, VOCAB)
    good = _tagged_output(batch)
    tokens = np.resize(good.tokens, len(good.tokens) + extra_tokens)
    probes = good.probes[: len(good.probes) + extra_probes] if extra_probes < 0 else good.probes + (("x", 0),)
    with pytest.raises(ValueError, match="the batch asked for 7 tokens and 4 probes"):
        split_output(reqs, batch, BatchOutput(tokens=tokens, probes=probes if extra_probes else good.probes))


def test_a_backend_returning_too_many_tokens_fails_every_request_of_the_batch():
    caps = Capabilities(page_size=PS, num_pages=16, num_host_pages=0, vocab_size=VOCAB, dtype="float32",
                        device="cpu", max_batch_tokens=64, max_batch_requests=8, max_sample_rows=16,
                        max_mask_bytes=1 << 16)
    seen: list[int] = []

    def forward(batch: ForwardBatch) -> BatchOutput:
        seen.append(batch.num_requests)
        good = _tagged_output(batch)
        return BatchOutput(tokens=np.append(good.tokens, 0), probes=good.probes)

    async def go() -> list[BaseException | object]:
        batcher = Batcher(BackendWorker.of(FunctionBackend(forward)), caps, policy="adaptive")
        try:
            # adaptive: the first batch fires at once with one request; gather all three
            return await asyncio.gather(*(batcher.submit(r) for r in _three_requests()), return_exceptions=True)
        finally:
            await batcher.close()

    results = asyncio.run(go())
    assert sum(seen) == 3
    assert all(isinstance(r, BackendError) and "asked for" in str(r) for r in results), results
