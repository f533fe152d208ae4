"""A prompt written in chunks gives the logits of the same prompt written in one pass."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.loaded import LoadedModel

SURFACE = "chunked_prefill"


@pytest.mark.parametrize("chunk", ["1", "5", "page", "page+3"])
def test_chunked_prefill_matches_one_pass(numeric: LoadedModel, rng: np.random.Generator, chunk: str) -> None:
    p = numeric.page_size
    size = {"1": 1, "5": 5, "page": p, "page+3": p + 3}[chunk]
    prompt = rng.integers(0, numeric.vocab, 2 * p + 7)
    whole_seq, chunked_seq = numeric.sequence(len(prompt)), numeric.sequence(len(prompt))
    whole, ref = numeric.both([whole_seq.step(prompt)])
    numeric.assert_close(whole, ref, "one-pass prefill")
    parts = []
    for start in range(0, len(prompt), size):
        parts.append(numeric.run([chunked_seq.step(prompt[start : start + size])]))
    if whole.logits is not None:
        chunked = np.concatenate([r.logits[0] for r in parts if r.logits is not None])
        bad = numeric.tolerance.bad(chunked, whole.logits[0])
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise AssertionError(
                f"chunks of {size}: row {row} differs from the one-pass prefill by "
                f"{np.abs(chunked[row] - whole.logits[0][row]).max():.3g} (allowed {numeric.tolerance})"
            )
    else:
        chunked_ids = np.concatenate([r.argmax[0] for r in parts if r.argmax is not None])
        assert whole.argmax is not None and np.array_equal(chunked_ids, whole.argmax[0]), (
            f"chunks of {size}: argmax tokens differ from the one-pass prefill"
        )
