"""Host interface ``zo``: evolution strategies over an adapter's LoRA weights.

A pass with ``zo_seed=s`` (``inference.forward``) runs the adapter's mean plus ``sigma`` times
the seed's noise (:mod:`pie_core.backend_kit.lora`); :func:`update` applies the rule of
:mod:`pie_core.adapters.es`. Both calls return at once; the backend applies them before the
caller's next pass (``adapter.settled`` waits for that).
"""

from __future__ import annotations

import math

import numpy as np

from pie_core.adapters.es import ZoState, step
from pie_core.backend import BackendCalls
from pie_core.errors import InvalidInput, Unsupported
from pie_core.host.adapter import HostAdapter
from pie_core.host.binding import current
from pie_core.backend_kit.lora import TARGETS, target_shape, tensor_index, tensor_name, zo_noise

__all__ = ["initialize", "update", "INIT_SEED"]

INIT_SEED = 0x5EED_1A17
"""The noise seed that draws a fresh adapter's A matrices (B starts at zero)."""


def initialize(
    adapter: HostAdapter,
    rank: int,
    alpha: float,
    population_size: int,
    mu_fraction: float,
    initial_sigma: float,
) -> None:
    """Reset ``adapter`` for zo training: rank ``rank`` over every projection, ``A`` drawn as
    ``zo_noise(INIT_SEED) / sqrt(in)``, ``B = 0`` (so the mean changes nothing yet), and
    ``sigma = initial_sigma``.

    Raises:
        InvalidInput: A value is out of range (population_size >= 2, 0 < mu_fraction <= 1,
            initial_sigma > 0, alpha finite).
        Unsupported: The backend does not run zo.
    """
    adapter.check_live()
    record = adapter.record
    model = record.model
    if "zo" not in model.caps.features:
        raise Unsupported(f"backend {model.backend!r} does not run zo passes (feature 'zo')")
    if isinstance(population_size, bool) or not isinstance(population_size, int) or population_size < 2:
        raise InvalidInput(f"population_size must be an integer >= 2, got {population_size!r}")
    if not isinstance(mu_fraction, (int, float)) or not 0 < mu_fraction <= 1:
        raise InvalidInput(f"mu_fraction must be in (0, 1], got {mu_fraction!r}")
    for what, value in (("initial_sigma", initial_sigma), ("alpha", alpha)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidInput(f"{what} must be a positive number, got {value!r}")
    current().engine.adapters.reshape(record, rank, float(alpha), False, TARGETS)
    record.zo = ZoState(population_size=population_size, mu_fraction=float(mu_fraction), sigma=float(initial_sigma))
    spec, scaling, sigma, adapter_id = model.spec, record.scaling, float(initial_sigma), record.id

    def reset(backend: BackendCalls) -> None:
        tensors = {}
        for layer in range(spec.num_layers):
            for target in TARGETS:
                out, inp = target_shape(spec, target)
                a = tensor_name(layer, target, "a")
                tensors[a] = zo_noise(INIT_SEED, tensor_index(a), (rank, inp)) / np.float32(math.sqrt(inp))
                tensors[tensor_name(layer, target, "b")] = np.zeros((out, rank), dtype=np.float32)
        backend.adapter_load(adapter_id, tensors, scaling)
        backend.adapter_zo(adapter_id, sigma, np.zeros(0, np.int64), np.zeros(0, np.float32))

    record.backend(reset)


def update(adapter: HostAdapter, scores: list[float], seeds: list[int], max_sigma: float) -> None:
    """Move the adapter's mean toward the better-scored candidates and adapt sigma (the rule is
    in :mod:`pie_core.adapters.es`); ``scores[i]`` is the score (higher is better) of the
    candidate that ran with ``zo_seed=seeds[i]``.

    Raises:
        InvalidInput: The adapter was not set up with :func:`initialize`, the lengths are not
            the population size, or a score, seed or ``max_sigma`` is invalid.
    """
    adapter.check_live()
    record = adapter.record
    state = record.zo
    if state is None:
        raise InvalidInput(f"adapter {record.name!r} is not set up for zo; call zo.initialize first")
    if len(scores) != state.population_size:
        raise InvalidInput(f"zo.update takes one score per candidate: the population is {state.population_size}, "
                           f"got {len(scores)} scores")
    move = step(state, list(scores), list(seeds), max_sigma)
    state.sigma, state.last_median = move.sigma, move.median
    record.version += 1
    adapter_id = record.id
    record.backend(lambda backend: backend.adapter_zo(adapter_id, move.sigma, move.seeds, move.coefficients))
