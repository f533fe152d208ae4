"""The inferlet SDK: write ``async def main(input)`` and drive generation yourself."""

from inferlet import chat, messaging, reasoning, runtime, session
from inferlet.context import Context, RawContext
from inferlet.forward import Forward, Output, ProbeHandle, SampleHandle
from inferlet.generator import GenStep, Generator
from inferlet.model import Model, Tokenizer
from inferlet.probes import Distribution, Entropy, Logits, Logprob, Logprobs
from inferlet.sampler import Sampler

ForwardPass = Forward

__all__ = [
    "chat",
    "messaging",
    "reasoning",
    "runtime",
    "session",
    "Context",
    "RawContext",
    "Forward",
    "ForwardPass",
    "Output",
    "ProbeHandle",
    "SampleHandle",
    "Generator",
    "GenStep",
    "Model",
    "Tokenizer",
    "Distribution",
    "Entropy",
    "Logits",
    "Logprob",
    "Logprobs",
    "Sampler",
]
