"""Adapters and zeroth-order (zo) perturbations, where declared.

Contract 1.x binds adapters per request (``adapter_ids``, -1 none) but has no hooks yet to
create or load them, so an adapter-declaring backend is checked for what the contract does fix:
requests without an adapter run the base model, and a batch naming an adapter the backend does
not hold is refused. ``zo_seeds`` (0 none) perturb the model reproducibly per request.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conformance.batches import kv_request
from conformance.harness import Harness
from conformance.loaded import LoadedModel, Run

SURFACE = "adapters"

_NO_SUCH_ADAPTER = 1_000_003


@pytest.fixture
def base(pie_conformance: Harness) -> LoadedModel:
    """The primary model with its reference (adapter checks do not depend on the architecture)."""
    pie_conformance.require_numerics()
    return pie_conformance.model()


def test_requests_without_an_adapter_run_the_base_model(base: LoadedModel, rng: np.random.Generator) -> None:
    base.require("adapters")
    req = kv_request(rng.integers(0, base.vocab, 6), base.pages_for(6), base.page_size)
    mine, ref = base.both([dataclasses.replace(req, adapter_id=-1)], [req])
    base.assert_close(mine, ref, "adapter_id -1")


def test_an_adapter_the_backend_does_not_hold_is_refused(model: LoadedModel, rng: np.random.Generator) -> None:
    model.require("adapters")
    req = kv_request(rng.integers(0, model.vocab, 3), model.pages_for(3), model.page_size)
    with pytest.raises(Exception):
        model.run([dataclasses.replace(req, adapter_id=_NO_SUCH_ADAPTER)])


def _zo(model: LoadedModel, prompt: np.ndarray, seed: int) -> Run:
    req = kv_request(prompt, model.pages_for(len(prompt)), model.page_size)
    return model.run([dataclasses.replace(req, zo_seed=seed)])


def test_zo_seed_zero_is_the_base_model(base: LoadedModel, rng: np.random.Generator) -> None:
    base.require("zo")
    req = kv_request(rng.integers(0, base.vocab, 6), base.pages_for(6), base.page_size)
    mine, ref = base.both([dataclasses.replace(req, zo_seed=0)], [req])
    base.assert_close(mine, ref, "zo_seed 0")


def test_zo_seed_perturbs_the_model_reproducibly(base: LoadedModel, rng: np.random.Generator) -> None:
    base.require("zo")
    base.require("probes")
    prompt = rng.integers(0, base.vocab, 6)
    plain, first, again = _zo(base, prompt, 0), _zo(base, prompt, 17), _zo(base, prompt, 17)
    assert plain.logits is not None and first.logits is not None
    assert base.tolerance.bad(first.logits[0], plain.logits[0]).any(), "zo_seed 17 left the logits unchanged"
    base.assert_close(again, first, "the same zo_seed twice")


def test_zo_requests_leave_their_neighbours_alone(base: LoadedModel, rng: np.random.Generator) -> None:
    base.require("zo")
    prompt = rng.integers(0, base.vocab, 5)
    plain = kv_request(prompt, base.pages_for(len(prompt)), base.page_size)
    perturbed = dataclasses.replace(kv_request(prompt, base.pages_for(len(prompt)), base.page_size), zo_seed=23)
    mine = base.run([perturbed, plain])
    ref = base.require_reference().run([plain, plain])
    base.assert_close(mine.pick(1), ref.pick(1), "a request without zo beside one with zo_seed 23")
