"""The paged KV store: writes and reads across page boundaries, on any pages, shared or not."""

from __future__ import annotations

import numpy as np

from conformance.batches import kv_request
from conformance.loaded import LoadedModel

SURFACE = "kv_paging"


def test_writes_and_reads_cross_page_boundaries(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    seq = numeric.sequence(2 * p + 5)
    cuts = [0, max(1, p - 2), p + 3, 2 * p + 4]  # the second chunk straddles page 0/1, the third 1/2
    for a, b in zip(cuts[:-1], cuts[1:]):
        mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, b - a))])
        numeric.assert_close(mine, ref, f"chunk of slots {a}..{b - 1}")
    mine, ref = numeric.both([seq.step(rng.integers(0, numeric.vocab, 1))])
    numeric.assert_close(mine, ref, f"decode reading slots 0..{2 * p + 4} over three pages")


def test_scattered_pages_match_contiguous_pages(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    reference = numeric.require_reference()
    scattered = numeric.pages_for(2 * p + 5)[::-1]
    contiguous = reference.contiguous_pages(len(scattered))
    prompt = rng.integers(0, numeric.vocab, 2 * p + 3)
    mine = numeric.run([kv_request(prompt, scattered, p)])
    ref = reference.run([kv_request(prompt, contiguous, p)])
    numeric.assert_close(mine, ref, f"prefill on pages {scattered} (reference on {contiguous})")
    nxt = rng.integers(0, numeric.vocab, 2)
    mine = numeric.run([kv_request(nxt, scattered, p, start=2 * p + 3)])
    ref = reference.run([kv_request(nxt, contiguous, p, start=2 * p + 3)])
    numeric.assert_close(mine, ref, "continuation on scattered pages")


def test_shared_prefix_pages_serve_many_requests(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    prefix_pages = numeric.pages(2)
    prefix = rng.integers(0, numeric.vocab, 2 * p)
    mine, ref = numeric.both([kv_request(prefix, prefix_pages, p)])
    numeric.assert_close(mine, ref, "prefix filling two pages")
    requests = [
        kv_request(rng.integers(0, numeric.vocab, n), prefix_pages + numeric.pages_for(n), p, start=2 * p)
        for n in (1, 3, 2)
    ]
    mine, ref = numeric.both(requests)
    numeric.assert_close(mine, ref, "three requests reading one shared prefix from the same pages")


def test_slots_past_the_kv_length_are_ignored(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    junk_page = numeric.pages(1)
    mine, ref = numeric.both([kv_request(rng.integers(0, numeric.vocab, p), junk_page, p)])
    numeric.assert_close(mine, ref, "filling a page with other tokens")
    length = p + max(1, p // 2)  # ends inside the junk page: its later slots hold stale K/V
    pages = numeric.pages(1) + junk_page + numeric.pages(1)
    mine, ref = numeric.both([kv_request(rng.integers(0, numeric.vocab, length), pages, p)])
    numeric.assert_close(mine, ref, "prefill ending mid-page over stale slots")
    mine, ref = numeric.both([kv_request(rng.integers(0, numeric.vocab, 1), pages, p, start=length)])
    numeric.assert_close(mine, ref, "decode with stale slots after the KV length")


def test_other_sequences_leave_a_sequence_untouched(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    first = numeric.sequence(p + 3)
    second = numeric.sequence(2 * p - 1)
    mine, ref = numeric.both([first.step(rng.integers(0, numeric.vocab, p + 2))])
    numeric.assert_close(mine, ref, "first sequence prefill")
    mine, ref = numeric.both([second.step(rng.integers(0, numeric.vocab, 2 * p - 1))])
    numeric.assert_close(mine, ref, "second sequence prefill on other pages")
    mine, ref = numeric.both([first.step(rng.integers(0, numeric.vocab, 1))])
    numeric.assert_close(mine, ref, "first sequence decode after the second one wrote")
