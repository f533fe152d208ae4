"""The oracle seen as a loaded model: the same page bookkeeping and :class:`~conformance.loaded.Run`
results as the backend under test, so a case sends the same requests to both and compares.

The reference answers what the oracle computes: every row's logits (float64), LOGITS and
EMBEDDING probes, and greedy sample rows (argmax, lowest id on ties, after the row's logit
mask). It draws no random samples and evaluates no other probe kind: those cases compute their
expected values themselves, from the definitions, on the backend's own logits.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from pie_core.hookspec import Capabilities, CopyKind, ProbeKind, SamplerKind
from pie_core.models.spec import ModelSpec
from pie_core.scheduler.request import ForwardRequest, SampleSpec

from conformance.loaded import LoadedModel, Run
from conformance.oracle import Oracle
from conformance.tolerances import Tolerance

__all__ = ["ReferenceModel"]


def _allowed(spec: SampleSpec, vocab: int) -> np.ndarray | None:
    if spec.logit_mask is None:
        return None
    packed = np.asarray(spec.logit_mask, dtype=np.uint8)
    return np.unpackbits(packed, count=vocab, bitorder="little").astype(bool)


class ReferenceModel(LoadedModel):
    """The float64 :class:`~conformance.oracle.Oracle` of one tiny model, on a pool the size of the
    backend's (so the same page ids work on both)."""

    def __init__(self, spec: ModelSpec, oracle: Oracle, caps: Capabilities, tolerance: Tolerance) -> None:
        super().__init__(spec, None, caps, tolerance, None, "reference")
        self.oracle = oracle
        self.mode = "logits"

    def forward(self, requests: Sequence[ForwardRequest]) -> Any:
        raise TypeError("the reference runs requests (run), not assembled batches")

    def forward_batch(self, batch: Any) -> Any:
        raise TypeError("the reference runs requests (run), not assembled batches")

    def copy_pages(self, kind: CopyKind, src: Sequence[int], dst: Sequence[int]) -> None:
        self.oracle.copy_pages(kind, src, dst)

    def run(self, requests: Sequence[ForwardRequest], *, observe: bool = True) -> Run:
        """Every row's logits, with the requests' greedy samples and LOGITS/EMBEDDING probes.

        Raises:
            ValueError: A stochastic sample row or another probe kind (see the module docstring).
        """
        computed = self.oracle.forward(requests)
        samples, probes = [], []
        for req, rows in zip(requests, computed):
            samples.append([self._greedy(s, rows.logits[s.index]) for s in req.samples])
            probes.append(tuple(self._probe(req, q, rows) for q in req.probes))
        return Run(
            requests=tuple(requests),
            batch=None,
            output=None,
            samples=tuple(samples),
            probes=tuple(probes),
            logits=tuple(rows.logits for rows in computed),
            argmax=None,
            source=self.label,
        )

    def _greedy(self, spec: SampleSpec, row: np.ndarray) -> tuple[int, ...]:
        if spec.kind != SamplerKind.ARGMAX and spec.temperature > 0:
            raise ValueError(
                f"the reference draws no random samples ({spec.kind.name} at temperature {spec.temperature}); "
                "check sampling on the backend's own logits instead"
            )
        allowed = _allowed(spec, self.vocab)
        if allowed is not None:
            row = np.where(allowed, row, -np.inf)
        return (int(np.argmax(row)),) * spec.draws  # argmax: the lowest id among equal maxima

    def _probe(self, req: ForwardRequest, probe: Any, rows: Any) -> np.ndarray:
        if probe.kind == ProbeKind.EMBEDDING:
            return np.asarray(rows.hidden[probe.index])
        if probe.kind != ProbeKind.LOGITS:
            raise ValueError(f"the reference answers LOGITS and EMBEDDING probes, not {probe.kind.name}")
        row = np.asarray(rows.logits[probe.index])
        if probe.masked_by >= 0:
            allowed = _allowed(req.samples[probe.masked_by], self.vocab)
            if allowed is not None:
                row = np.where(allowed, row, -np.inf)
        return row
