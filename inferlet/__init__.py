"""The inferlet SDK: write ``async def main(input)`` and drive generation yourself."""

from inferlet import chat, mcp, messaging, reasoning, runtime, scheduling, session, spec, tools, zo
from inferlet.adapter import Adapter
from inferlet.constraints import AnyJson, Constraint, Ebnf, JsonSchema, Regex, Schema
from inferlet.context import Context, RawContext
from inferlet.events import Decoder, Event, EventStream
from inferlet.forward import Forward, Output, ProbeHandle, SampleHandle
from inferlet.generator import GenStep, Generator
from inferlet.grammar import Grammar, GrammarConstraint, Matcher
from inferlet.model import Model, Tokenizer
from inferlet.probes import Distribution, Embedding, Entropy, Logits, Logprob, Logprobs
from inferlet.sampler import Sampler
from inferlet.spec import Speculator

ForwardPass = Forward
TokenStream = Generator

__all__ = [
    "chat",
    "mcp",
    "messaging",
    "reasoning",
    "runtime",
    "scheduling",
    "session",
    "spec",
    "tools",
    "zo",
    "Adapter",
    "Context",
    "RawContext",
    "Decoder",
    "Event",
    "EventStream",
    "TokenStream",
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
    "Embedding",
    "Entropy",
    "Logits",
    "Logprob",
    "Logprobs",
    "Sampler",
    "Speculator",
    "AnyJson",
    "Constraint",
    "Ebnf",
    "JsonSchema",
    "Regex",
    "Schema",
    "Grammar",
    "GrammarConstraint",
    "Matcher",
]
