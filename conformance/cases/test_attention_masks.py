"""Custom attention masks (one bool row per input token over the request's KV, true = attend)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.batches import kv_request
from conformance.loaded import LoadedModel

SURFACE = "attention_masks"


@pytest.fixture
def masked(numeric: LoadedModel) -> LoadedModel:
    numeric.require("custom_mask")
    return numeric


def _causal(start: int, n: int, kv_len: int) -> np.ndarray:
    return np.arange(kv_len)[None, :] <= (start + np.arange(n))[:, None]


def test_explicit_causal_mask_equals_the_default(masked: LoadedModel, rng: np.random.Generator) -> None:
    p = masked.page_size
    prompt = rng.integers(0, masked.vocab, p + 4)
    plain = masked.run([kv_request(prompt, masked.pages_for(len(prompt)), p)])
    causal = _causal(0, len(prompt), len(prompt))
    mine, ref = masked.both([kv_request(prompt, masked.pages_for(len(prompt)), p, mask=causal)])
    masked.assert_close(mine, ref, "explicit causal mask")
    masked.assert_close(mine, plain, "explicit causal mask vs no mask")


def test_custom_mask_matches_reference(masked: LoadedModel, rng: np.random.Generator) -> None:
    p = masked.page_size
    seq = masked.sequence(p + 9)
    mine, ref = masked.both([seq.step(rng.integers(0, masked.vocab, p + 3))])
    masked.assert_close(mine, ref, "unmasked prefix")
    n, start = 6, seq.length
    mask = (rng.random((n, start + n)) < 0.5) & _causal(start, n, start + n)
    mask[np.arange(n), start + np.arange(n)] = True  # each row sees at least itself
    mine, ref = masked.both([seq.step(rng.integers(0, masked.vocab, n), mask=mask)])
    masked.assert_close(mine, ref, "random mask over a cached prefix")


def test_fully_masked_page_is_ignored(masked: LoadedModel, rng: np.random.Generator) -> None:
    p = masked.page_size
    head = rng.integers(0, masked.vocab, p)
    tail = rng.integers(0, masked.vocab, 4)
    runs = []
    for hidden_fill in (rng.integers(0, masked.vocab, p), rng.integers(0, masked.vocab, p)):
        seq = masked.sequence(2 * p + 4)
        masked.both([seq.step(head)])
        masked.both([seq.step(hidden_fill)])  # page 1: different tokens each time
        mask = _causal(2 * p, len(tail), 2 * p + len(tail))
        mask[:, p : 2 * p] = False  # no row sees page 1
        mine, ref = masked.both([seq.step(tail, mask=mask)])
        masked.assert_close(mine, ref, "rows that mask out a whole page")
        runs.append(mine)
    masked.assert_close(runs[0], runs[1], "two sequences differing only in a fully masked page")


def test_mask_on_a_single_token_row_matches_reference(masked: LoadedModel, rng: np.random.Generator) -> None:
    p = masked.page_size
    seq = masked.sequence(p + 3)
    masked.both([seq.step(rng.integers(0, masked.vocab, p + 2))])
    mask = rng.random((1, p + 3)) < 0.4
    mask[0, -1] = True
    mine, ref = masked.both([seq.step(rng.integers(0, masked.vocab, 1), mask=mask)])
    masked.assert_close(mine, ref, "masked decode row")


def test_masked_and_unmasked_requests_share_a_batch(masked: LoadedModel, rng: np.random.Generator) -> None:
    p = masked.page_size
    a, b, c = masked.sequence(8), masked.sequence(6), masked.sequence(p + 5)
    masked.both([s.step(rng.integers(0, masked.vocab, 5)) for s in (a, b, c)])
    mask = _causal(5, 3, 8)
    mask[:, 1:3] = False
    mine, ref = masked.both(
        [
            a.step(rng.integers(0, masked.vocab, 3), mask=mask),
            b.step(rng.integers(0, masked.vocab, 1)),
            c.step(rng.integers(0, masked.vocab, p)),
        ]
    )
    masked.assert_close(mine, ref, "one masked request between unmasked ones")
