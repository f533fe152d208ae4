"""The types that cross the host API: handles (engine objects held by reference), and the
values that cross by value (what to sample and probe, what comes back, grammar sources, tool-call
syntaxes).

Standard library only: the SDK runs where numpy is not installed (a WebAssembly guest), and the
engine uses these very classes (``pie_core.values``, ``pie_core.hookspec`` and the grammar and
chat-format modules re-export them), so a value means the same on both sides of every transport.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, Any, ClassVar, Literal

__all__ = ["Handle", "Context", "Matcher", "ChatBuilder", "Subscription", "McpSession", "Adapter", "Model",
           "HANDLES", "IntRange", "U32", "S32", "U64", "S64", "SamplerKind", "ProbeKind", "SampleSpec", "ProbeSpec",
           "RequestOutput", "GrammarKind", "GrammarSource", "ToolCallSyntax", "RECORDS"]


@dataclass(frozen=True, slots=True)
class IntRange:
    """The integers a declared ``int`` may be: its WIT type and ``low <= value < high``.

    A plain ``int`` in a declaration is a :data:`U32`; the few others say which they are
    (``zo_seed: S64``), so the SDK can refuse a value the wire cannot carry before it crosses
    (:mod:`inferlet.host.arguments`) and ``wit/`` is held to the same widths.
    """

    wit: str
    low: int
    high: int


U32 = Annotated[int, IntRange("u32", 0, 2**32)]
"""What a plain ``int`` in a declaration is (a count, an index, a token id, a position)."""

S32 = Annotated[int, IntRange("s32", -2**31, 2**31)]
"""A declared ``int`` that may be negative (``-1`` meaning "none")."""

U64 = Annotated[int, IntRange("u64", 0, 2**64)]
"""A declared ``int`` wider than a ``u32`` (a seed)."""

S64 = Annotated[int, IntRange("s64", -2**63, 2**63)]
"""A declared ``int`` wider than a ``u32`` that may be negative (a signed seed)."""


class Handle:
    """An engine object an inferlet holds by reference: a context, a matcher, a subscription...

    The classes below only name the kinds in the declaration (``def fork(ctx: Context) ->
    Context``); the object a transport hands the SDK is the transport's own (the engine object
    in-process, an opaque token over the process wire, a WIT resource in wasm). The SDK passes
    it back to host functions unchanged and never looks inside. ``wit`` is the WIT resource name.
    """

    wit: ClassVar[str]


class Context(Handle):
    """A KV-cache context."""

    wit = "context"


class Matcher(Handle):
    """A grammar matcher on one model's vocabulary."""

    wit = "matcher"


class ChatBuilder(Handle):
    """A stateful chat-format builder for one conversation."""

    wit = "chat-builder"


class Subscription(Handle):
    """A messaging subscription to one topic."""

    wit = "subscription"


class McpSession(Handle):
    """A session with one MCP server."""

    wit = "mcp-session"


class Adapter(Handle):
    """A LoRA adapter."""

    wit = "adapter"


class Model(Handle):
    """A loaded model; opaque, it only proves the model exists."""

    wit = "model"


HANDLES: tuple[type[Handle], ...] = (Context, Matcher, ChatBuilder, Subscription, McpSession, Adapter, Model)
"""Every kind of handle, in the order of the WIT ``types`` interface."""


class SamplerKind(IntEnum):
    """How a sample row picks its token(s). Temperature applies before every filter."""

    ARGMAX = 0
    TOP_K = 1
    TOP_P = 2
    MIN_P = 3
    TOP_K_TOP_P = 4
    MULTINOMIAL = 5  # ``draws`` independent draws from the full tempered distribution


class ProbeKind(IntEnum):
    """What a probe row reads at one input position (off its logits, except EMBEDDING)."""

    LOGITS = 0  # float32[vocab], raw (after the logit mask: masked entries are -inf)
    DISTRIBUTION = 1  # top-k (ids, probs) of softmax(logits / temperature); k = 0 means all
    LOGPROBS = 2  # log-softmax at the given token ids, in their order
    ENTROPY = 3  # -sum p log p of softmax(logits), a float
    EMBEDDING = 4  # float32[hidden]: the final hidden state (after the final norm, before the
    # output projection). Only sent to backends declaring the "embeddings" feature (since 1.1).


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """Sample one input row of the request.

    ``index`` is relative to the request's input tokens. ``logit_mask`` is None for no mask, or
    the vocabulary packed 8 tokens per byte, little bit order (token ``t`` is bit ``t & 7`` of
    byte ``t >> 3``): ``bytes`` from the SDK, which ``pie_core.host.inference.forward`` turns
    into the uint8 numpy row (``np.packbits(bitorder="little")``) the batcher takes.
    """

    index: int
    kind: SamplerKind = SamplerKind.ARGMAX
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    draws: int = 1
    seed: U64 = 0
    logit_mask: Any = None


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """Probe one input row of the request.

    ``masked_by`` is the position in the request's ``samples`` list whose logit mask applies
    to this probe, or -1 for the raw logits.
    """

    index: int
    kind: ProbeKind
    temperature: float = 1.0
    k: int = 0
    token_ids: tuple[int, ...] = ()
    masked_by: S32 = -1


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """The part of a batch's output that belongs to one request.

    ``tokens[i]`` holds the ids drawn for ``samples[i]`` (one unless multinomial draws > 1);
    ``probes[i]`` the value of ``probes[i]``. For a pass with speculative drafts,
    ``drafts_kept`` says how many drafts the KV kept (see ``inferlet.host.inference.forward``).

    Inside the engine a probe value is what the backend returned (numpy arrays, see
    ``pie_core.hookspec.BatchOutput``); ``pie_core.host.inference.forward`` hands the SDK plain
    values: native-endian float32 ``bytes`` for LOGITS, ``(list[int], list[float])`` for
    DISTRIBUTION, ``list[float]`` for LOGPROBS and EMBEDDING, ``float`` for ENTROPY.
    """

    tokens: tuple[tuple[int, ...], ...]
    probes: tuple[object, ...]
    drafts_kept: int = 0


GrammarKind = Literal["json_schema", "json", "regex", "gbnf", "lark", "structural_tag"]


@dataclass(frozen=True, slots=True)
class GrammarSource:
    """A grammar as text: ``kind`` says how ``text`` is read. The engine checks and parses it
    where it is made (``grammar.json_schema``, ``grammar.regex``, ...).

    Attributes:
        kind: ``json_schema`` (a JSON Schema), ``json`` (any JSON value), ``regex``,
            ``gbnf``, ``lark``, or ``structural_tag`` (xgrammar's structural-tag JSON, used for
            tool calls).
        text: The schema, pattern or grammar text (empty for ``json``).
        whitespace: For ``json_schema`` and ``json``: allow any whitespace between JSON tokens.
            The default (False) writes JSON on one line with ``", "`` and ``": "`` separators,
            which keeps small models from looping on whitespace.
    """

    kind: GrammarKind
    text: str = ""
    whitespace: bool = False

    def describe(self) -> str:
        """A short name for messages: ``JSON schema``, ``regex '[0-9]+'``..."""
        names = {"json_schema": "JSON schema", "json": "JSON", "regex": "regex", "gbnf": "GBNF grammar",
                 "lark": "Lark grammar", "structural_tag": "tool-call grammar"}
        if self.kind == "regex":
            shown = self.text if len(self.text) <= 40 else self.text[:37] + "..."
            return f"regex {shown!r}"
        return names[self.kind]


@dataclass(frozen=True, slots=True)
class ToolCallSyntax:
    """One model family's tool-call syntax.

    Attributes:
        style: ``"qwen"`` (marked blocks) or ``"llama"`` (a bare JSON object).
        begin: Text that opens a call (``"<tool_call>"``; empty for a bare object).
        end: Text that closes a call (``"</tool_call>"``; empty for a bare object).
        args_key: The key holding the arguments (``"arguments"`` or ``"parameters"``).
        reasoning: Whether the reply may open with a reasoning block.
    """

    style: Literal["qwen", "llama"]
    begin: str
    end: str
    args_key: str
    reasoning: bool = False


RECORDS: tuple[type, ...] = (SampleSpec, ProbeSpec, RequestOutput, GrammarSource, ToolCallSyntax)
"""The dataclasses that cross by value, as WIT records of the same name."""
