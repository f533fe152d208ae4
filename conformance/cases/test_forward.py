"""Forward numerics on every architecture: prefill and decode logits match the float64 oracle."""

from __future__ import annotations

import numpy as np

from conformance.loaded import LoadedModel

SURFACE = "forward"


def test_prefill_matches_reference(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    seq = numeric.sequence(2 * p + 5)
    mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, 2 * p + 5))])
    numeric.assert_close(mine, ref, "prefill over three pages")


def test_decode_steps_match_reference(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    prompt = max(1, p - 2)
    seq = numeric.sequence(prompt + 4)
    mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, prompt))])
    numeric.assert_close(mine, ref, "prefill")
    for i in range(4):  # the third step opens the second page
        mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, 1))])
        numeric.assert_close(mine, ref, f"decode step {i}")


def test_positions_feed_rope_not_slots(numeric: LoadedModel, rng: np.random.Generator) -> None:
    seq = numeric.sequence(10, positions_offset=37)
    mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, 9))])
    numeric.assert_close(mine, ref, "prefill at positions 37.. in slots 0..")
    mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, 1))])
    numeric.assert_close(mine, ref, "decode at position 46 in slot 9")


def test_single_token_prompt_matches_reference(numeric: LoadedModel, rng: np.random.Generator) -> None:
    seq = numeric.sequence(1)
    mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, 1))])
    numeric.assert_close(mine, ref, "one-token prompt")
