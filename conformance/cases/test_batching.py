"""Mixed batches: prefill chunks and decode rows of many lengths together, order-independent."""

from __future__ import annotations

import numpy as np

from conformance.batches import kv_request
from conformance.loaded import LoadedModel

SURFACE = "batching"


def test_mixed_prefill_and_decode_batch_matches_reference(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    old_long, old_short = numeric.sequence(2 * p + 2), numeric.sequence(12)
    mine, ref = numeric.both(
        [old_long.step(rng.integers(0, numeric.vocab, 2 * p + 1)), old_short.step(rng.integers(0, numeric.vocab, 5))]
    )
    numeric.assert_close(mine, ref, "setting up two sequences")
    fresh, first_token = numeric.sequence(p + 5), numeric.sequence(1)
    batch = [
        fresh.step(rng.integers(0, numeric.vocab, p + 5)),  # new prompt over two pages
        old_long.step(rng.integers(0, numeric.vocab, 1)),  # decode on a long sequence
        old_short.step(rng.integers(0, numeric.vocab, 7)),  # a prefill chunk onto cached tokens
        first_token.step(rng.integers(0, numeric.vocab, 1)),  # a one-token prompt
    ]
    mine, ref = numeric.both(batch)
    numeric.assert_close(mine, ref, "mixed prefill/decode batch")


def test_results_do_not_depend_on_the_rest_of_the_batch(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    prompts = [rng.integers(0, numeric.vocab, n) for n in (3, p + 1, 1, 2 * p)]
    alone = [numeric.run([kv_request(t, numeric.pages_for(len(t)), p)]) for t in prompts]
    together = numeric.run([kv_request(t, numeric.pages_for(len(t)), p) for t in reversed(prompts)])
    for i, single in enumerate(alone):
        j = len(prompts) - 1 - i  # the batch holds the prompts in reverse order
        numeric.assert_close(together.pick(j), single, f"request {i} in a batch of four vs alone")


def test_decode_rows_of_many_lengths_match_reference(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    lengths = [max(1, n) for n in (1, 2, p - 1, p, p + 1, 2 * p, 3 * p + 2, 5)]
    seqs = [numeric.sequence(n + 1) for n in lengths]
    mine, ref = numeric.both([s.step(rng.integers(0, numeric.vocab, n)) for s, n in zip(seqs, lengths)])
    numeric.assert_close(mine, ref, "prefills of eight lengths in one batch")
    mine, ref = numeric.both([s.step(rng.integers(0, numeric.vocab, 1)) for s in seqs])
    numeric.assert_close(mine, ref, "eight decode rows of different KV lengths")
