"""Fixtures the cases share: the primary model, and the numeric model of each architecture."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.harness import Harness
from conformance.loaded import LoadedModel


@pytest.fixture
def model(pie_conformance: Harness) -> LoadedModel:
    """The first selected architecture's tiny model (non-numeric surfaces use only this one)."""
    return pie_conformance.model()


@pytest.fixture
def numeric(pie_conformance: Harness, pie_arch: str) -> LoadedModel:
    """The ``pie_arch`` tiny model with its reference; "not supported" when numerics are off."""
    pie_conformance.require_numerics()
    return pie_conformance.model(pie_arch)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded by the case's name, so every run feeds the same tokens."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.name)) % (1 << 31)
    return np.random.default_rng(seed)
