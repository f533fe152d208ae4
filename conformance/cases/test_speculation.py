"""Speculative verification: drafts are ordinary input rows, and rejected drafts leave no trace."""

from __future__ import annotations

import dataclasses

import numpy as np

from pie_core.hookspec import SamplerKind
from pie_core.scheduler.request import SampleSpec

from conformance.batches import kv_request
from conformance.loaded import LoadedModel

SURFACE = "speculation"


def test_verification_batch_matches_sequential_decoding(numeric: LoadedModel, rng: np.random.Generator) -> None:
    prompt = rng.integers(0, numeric.vocab, 9)
    drafts = rng.integers(0, numeric.vocab, 4)
    verify, stepwise = numeric.sequence(13), numeric.sequence(13)
    numeric.both([verify.step(prompt), stepwise.step(prompt)])
    greedy = tuple(SampleSpec(index=i, kind=SamplerKind.ARGMAX) for i in range(len(drafts)))
    mine, ref = numeric.both([verify.step(drafts, samples=greedy)])
    numeric.assert_close(mine, ref, "verification pass of four drafts")
    for i, token in enumerate(drafts):
        step = numeric.run([stepwise.step([token], samples=(SampleSpec(index=0, kind=SamplerKind.ARGMAX),))])
        if mine.logits is not None and step.logits is not None:
            bad = numeric.tolerance.bad(mine.logits[0][i], step.logits[0][0])
            assert not bad.any(), f"draft {i}: verification logits differ from decoding it on its own"
        assert mine.samples[0][i] == step.samples[0][0] or _near_tie(mine, i, numeric), (
            f"draft {i}: verification picked {mine.samples[0][i]}, sequential decoding {step.samples[0][0]}"
        )


def _near_tie(run: object, row: int, model: LoadedModel) -> bool:
    logits = getattr(run, "logits", None)
    if logits is None:
        return False
    top = np.sort(logits[0][row])[-2:]
    return bool(top[1] - top[0] <= 2 * (model.tolerance.atol + model.tolerance.rtol * abs(top[1])))


def test_rejected_drafts_are_overwritten(numeric: LoadedModel, rng: np.random.Generator) -> None:
    p = numeric.page_size
    start = max(2, p - 3)  # the drafts straddle a page boundary
    seq = numeric.sequence(start + 5)
    numeric.both([seq.step(rng.integers(0, numeric.vocab, start))])
    numeric.both([seq.step(rng.integers(0, numeric.vocab, 5))])  # one token, then four drafts
    seq.rewind(3)  # one draft accepted; three rejected, their K/V still in the pages
    mine, _ = numeric.both([seq.step(rng.integers(0, numeric.vocab, 2))])  # overwrites two of them
    fresh = numeric.require_reference().run([kv_request(seq.history, numeric.pages_for(seq.length), p)])
    assert fresh.logits is not None
    tail = dataclasses.replace(fresh, logits=(fresh.logits[0][-2:],))
    numeric.assert_close(mine, tail, "after rejecting drafts, vs the accepted tokens alone on the reference")


def test_tree_drafts_under_a_mask_match_their_branches(numeric: LoadedModel, rng: np.random.Generator) -> None:
    numeric.require("custom_mask")
    p = numeric.page_size
    prompt = rng.integers(0, numeric.vocab, 6)
    root, left, right = (int(t) for t in rng.integers(0, numeric.vocab, 3))
    tree = numeric.pages_for(len(prompt) + 3)
    numeric.both([kv_request(prompt, tree, p)])
    n = len(prompt)
    mask = np.tril(np.ones((3, n + 3), dtype=bool), k=n)
    mask[2, n + 1] = False  # the right branch does not see the left one
    req = kv_request([root, left, right], tree, p, start=n, positions=[n, n + 1, n + 1], mask=mask)
    mine, ref = numeric.both([req])
    numeric.assert_close(mine, ref, "a two-branch draft tree in one pass")
    branch = numeric.run([kv_request([*prompt, root, right], numeric.pages_for(len(prompt) + 2), p)])
    if mine.logits is not None and branch.logits is not None:
        bad = numeric.tolerance.bad(mine.logits[0][2], branch.logits[0][-1])
        assert not bad.any(), "the right branch's logits differ from decoding that branch alone"
