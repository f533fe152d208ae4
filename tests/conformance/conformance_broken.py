"""Backends the suite must refuse readably, and one that records its options.

Passed to the suite as ``--pie-backend conformance_broken:Name`` (this folder is on PYTHONPATH in
the child runs). Each is the NumPy backend with one thing wrong: a hook whose argument is
misspelt, a factory whose import fails, a ``BackendInfo`` offering a feature the loaded model
does not declare or a feature name the contract does not have. ``RecordsOptions`` appends each
load's ``BackendOptions.extra`` to the file named by ``$PIE_TEST_OPTIONS_LOG``, one JSON object a
line, and refuses options it does not know, as a real backend should.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable

import numpy as np

from pie_backend_cpu import CpuBackend
from pie_core.hookspec import BackendInfo, BackendOptions, BatchOutput, Capabilities, hookimpl
from pie_core.models.spec import ModelSpec

__all__ = ["WrongSignature", "import_fails", "OffersUndeclaredFeature", "OffersMisspeltFeature", "RecordsOptions"]

OPTIONS_LOG = "PIE_TEST_OPTIONS_LOG"
KNOWN_OPTIONS = ("provider", "workers", "fp8")


class WrongSignature(CpuBackend):
    """``pie_backend_forward`` takes ``bach``, not ``batch``: pluggy refuses to register it."""

    @hookimpl
    def pie_backend_forward(self, bach: Any) -> BatchOutput:  # type: ignore[override]
        raise AssertionError("never called: the hook spec refuses this signature")


def import_fails() -> CpuBackend:
    """A factory whose backend needs a library that is not installed."""
    raise ImportError("No module named 'tensorrt' (pip install tensorrt)")


class OffersUndeclaredFeature(CpuBackend):
    """Offers ``system_speculation`` in ``BackendInfo`` but never declares it when loaded."""

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        info = super().pie_backend_info()
        return dataclasses.replace(info, features=info.features | {"system_speculation"})


class OffersMisspeltFeature(CpuBackend):
    """Offers ``logit_masks`` (the contract's name is ``logit_mask``) in ``BackendInfo``."""

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        info = super().pie_backend_info()
        return dataclasses.replace(info, features=info.features | {"logit_masks"})


class RecordsOptions(CpuBackend):
    """Logs every load's ``options.extra``, refuses unknown keys, then loads as the NumPy backend does."""

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        with open(os.environ[OPTIONS_LOG], "a") as log:
            log.write(json.dumps(options.extra) + "\n")
        unknown = sorted(set(options.extra) - set(KNOWN_OPTIONS))
        if unknown:
            raise ValueError(f"unknown backend options {unknown}; this backend takes {', '.join(KNOWN_OPTIONS)}")
        # the options are this backend's own: the NumPy backend under it takes none
        return super().pie_backend_load_model(spec=spec, weights=weights, options=dataclasses.replace(options, extra={}))
