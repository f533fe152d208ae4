"""Value types of a forward pass that cross the host API by value: what to sample and probe, and
what comes back.

They are the SDK's own classes (:mod:`inferlet.host.types`, standard library only), so the
engine and every runner's SDK mean the same values. ``pie_core.hookspec`` and
``pie_core.scheduler.request`` re-export them.
"""

from __future__ import annotations

from inferlet.host.types import ProbeKind, ProbeSpec, RequestOutput, SampleSpec, SamplerKind

__all__ = ["SamplerKind", "ProbeKind", "SampleSpec", "ProbeSpec", "RequestOutput"]
