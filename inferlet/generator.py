"""Generators: the decode loop. ``g = ctx.generate(sampler, max_tokens=...)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from pie_core.host.errors import InvalidInput, Unsupported
from pie_core.host import model as _model
from inferlet.constraints import ConstraintSet, as_schema, parse_json
from inferlet.forward import Forward, Output, ProbeHandle
from inferlet.probes import Probe
from inferlet.sampler import Sampler

if TYPE_CHECKING:
    from inferlet.context import Context

__all__ = ["Generator", "GenStep"]

_LATER = ("speculator", "system_speculation", "adapter", "zo_seed")


class Generator:
    """The decode loop of a context.

    Each step runs the context's buffered tokens (on the first step, the prompt; afterwards
    the last accepted token) and samples the next token. Accepted tokens go back into the
    context's buffer, so the context holds the whole conversation — except a final stop token,
    which is left out so that ``ctx.seal()`` can close the turn as the chat template does.

    Keyword options (all optional): ``max_tokens`` (stop after n accepted tokens), ``stop``
    (stop-token ids; with ``auto_flush`` they default to the chat format's), ``logit_mask``
    (BRLE applied every step), ``constrain`` (a Schema or Constraint, or a list of them, ANDed;
    see :mod:`inferlet.constraints`), ``horizon`` (expected output length, a scheduling hint),
    ``auto_flush`` (default True: append ``cue()`` first and use the chat stop tokens).
    """

    def __init__(
        self,
        ctx: Context,
        sampler: Sampler,
        *,
        max_tokens: int | None = None,
        stop: Iterable[int] | None = None,
        logit_mask: list[int] | None = None,
        horizon: int | None = None,
        auto_flush: bool = True,
        constrain: Any = None,
        **later: Any,
    ) -> None:
        unknown = sorted(set(later) - set(_LATER))
        if unknown:
            raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
        asked = [k for k, v in later.items() if v not in (None, False)]
        if asked:
            raise Unsupported(f"generate({asked[0]}=...) is not available in this engine build yet")
        if not isinstance(sampler, Sampler):
            raise TypeError(f"generate() needs a Sampler, got {type(sampler).__name__}")
        if not sampler.draws_tokens:
            raise InvalidInput("Sampler.embedding() draws no token, so it cannot drive generate(); "
                               "read embeddings with fwd.sample(...) or g.probe_each_step(-1, Embedding())")
        self._ctx = ctx
        self._sampler = sampler
        self._max = _check_max(max_tokens)
        self._logit_mask = logit_mask
        self._horizon = _check_horizon(horizon)
        self._rules: ConstraintSet | None = None  # constraints, ANDed (see inferlet.constraints)
        if constrain is not None:
            self.constrain(constrain)
        if auto_flush:
            ctx.cue()
        if stop is None:
            stop = _model.stop_tokens(ctx.model.name) if auto_flush else ()
        self._stop = set(int(t) for t in stop)
        self._tokens: list[int] = []
        self._done = False
        self._each_step: list[tuple[int, Probe]] = []

    # -- builder -----------------------------------------------------------------------------
    def max_tokens(self, n: int) -> Generator:
        """Hard cap on accepted tokens."""
        self._max = _check_max(n)
        return self

    def stop(self, tokens: Iterable[int]) -> Generator:
        """Replace the stop set."""
        self._stop = set(int(t) for t in tokens)
        return self

    def add_stop(self, tokens: Iterable[int]) -> Generator:
        """Add to the stop set."""
        self._stop.update(int(t) for t in tokens)
        return self

    def horizon(self, n: int) -> Generator:
        """Hint the expected output length (used for credit pacing)."""
        self._horizon = _check_horizon(n)
        return self

    def constrain(self, c: Any) -> Generator:
        """Add a constraint (a Schema, a Constraint, or a list); ANDed with those attached."""
        if self._rules is None:
            self._rules = ConstraintSet(self._ctx.model, self._logit_mask)
        self._rules.add(c)
        return self

    def probe_each_step(self, idx: int, probe: Probe) -> ProbeHandle:
        """Attach ``probe`` to input row ``idx`` of every step (-1 = the sampled row)."""
        self._each_step.append((idx, probe))
        return ProbeHandle(len(self._each_step) - 1, probe.spec(0).kind)

    # -- inspection --------------------------------------------------------------------------
    @property
    def tokens_generated(self) -> int:
        """Tokens accepted so far."""
        return len(self._tokens)

    @property
    def is_done(self) -> bool:
        """True once a stop token or ``max_tokens`` ended generation."""
        return self._done

    # -- driving -----------------------------------------------------------------------------
    def __aiter__(self) -> Generator:
        return self

    async def __anext__(self) -> GenStep:
        if self._done:
            raise StopAsyncIteration
        return GenStep(self)

    async def collect_tokens(self) -> list[int]:
        """Run to the end; return every accepted token (a final stop token included)."""
        async for step in self:
            await step.execute()
        return list(self._tokens)

    async def collect_text(self) -> str:
        """Run to the end and return the reply text (stop tokens excluded)."""
        from inferlet.chat import Decoder, Event

        tokens = await self.collect_tokens()
        if tokens and tokens[-1] in self._stop:  # a stop token of ``stop=`` is not text either
            tokens = tokens[:-1]
        dec = Decoder(self._ctx.model)
        parts: list[str] = []
        for tok in tokens:
            ev = dec.feed([tok])
            if isinstance(ev, Event.Done):
                return ev.text
            if isinstance(ev, Event.Delta):
                parts.append(ev.text)
        return "".join(parts)

    async def collect_json(self, *, schema: Any = None, parse: Callable[[str], Any] | None = None) -> Any:
        """Constrain to JSON, run to the end, and return the parsed reply.

        Args:
            schema: A JSON Schema (text or dict), or any Schema/Constraint; None = any JSON.
            parse: Called with the JSON text instead of ``json.loads``; its result is returned.

        Raises:
            InvalidInput: The reply is not complete JSON (e.g. ``max_tokens`` cut it short).
        """
        self.constrain(as_schema(schema))
        text = await self.collect_text()
        return parse(text) if parse is not None else parse_json(text, len(self._tokens))

    async def tokens(self) -> list[int]:
        """Alias of :meth:`collect_tokens` (the readme's ``stream.tokens()``)."""
        return await self.collect_tokens()

    async def text(self) -> str:
        """Alias of :meth:`collect_text` (the readme's ``stream.text()``)."""
        return await self.collect_text()

    def accept(self, tokens: Iterable[int]) -> list[int]:
        """Register tokens picked by the caller (e.g. after ``clear_sampler``).

        Returns:
            The tokens actually accepted (cut at a stop token or ``max_tokens``, and before a
            token the generator's constraints forbid).
        """
        accepted: list[int] = []
        for tok in tokens:
            if self._done:
                break
            if self._rules is not None:  # reconcile: a token the constraints forbid ends the list
                if not self._rules.admits(int(tok)):
                    break
                self._rules.accept(int(tok))
            accepted.append(int(tok))
            self._tokens.append(int(tok))
            if tok in self._stop or (self._max is not None and len(self._tokens) >= self._max):
                self._done = True
            elif self._rules is not None and self._rules.ended:
                self._done = True
        # A final stop token is reported but not kept: ``ctx.seal()`` closes the turn the way
        # the chat template does, so the conversation can go on.
        keep = accepted[:-1] if accepted and accepted[-1] in self._stop else accepted
        self._ctx.append(keep)
        return accepted


class GenStep:
    """One iteration of a generator: adjust it, then ``await step.execute()``."""

    def __init__(self, gen: Generator) -> None:
        self._gen = gen
        self._sample = True
        self._probes: list[tuple[int, Probe]] = []
        self._executed = False

    def clear_sampler(self) -> GenStep:
        """Drop the auto-attached sampler: the pass still runs; pick the token yourself and
        register it with ``g.accept``."""
        self._sample = False
        return self

    def probe(self, idx: int, probe: Probe) -> ProbeHandle:
        """Attach a probe for this iteration only (indices of the step's input; -1 = last).
        Handles number after the generator's ``probe_each_step`` probes."""
        self._probes.append((idx, probe))
        return ProbeHandle(len(self._gen._each_step) + len(self._probes) - 1, probe.spec(0).kind)

    async def execute(self) -> Output:
        """Run the step's forward pass and fold the sampled token into the generator."""
        if self._executed:
            raise InvalidInput("this generator step was already executed; take the next step")
        gen, ctx = self._gen, self._gen._ctx
        if gen._rules is not None:  # compile (off the loop) and mask first: a dead end runs nothing
            await gen._rules.ready()
            gen._rules.mask()
        tokens = ctx._take_buffer()
        if not tokens:
            raise InvalidInput("nothing to run: the context buffer is empty (add a prompt or ctx.cue())")
        fwd = Forward(ctx).input(tokens)
        if gen._logit_mask is not None and gen._rules is None:
            fwd.mask(gen._logit_mask)
        for idx, probe in (*gen._each_step, *self._probes):
            fwd.probe(idx % len(tokens) if idx < 0 else idx, probe)
        # after the probes: a Sampler.dist adds its own probe, which must not shift their handles
        handle = fwd.sample([len(tokens) - 1], gen._sampler) if self._sample else None
        if gen._rules is not None:
            gen._rules.attach(fwd)
        self._executed = True
        try:
            raw = await fwd._submit()
        except BaseException:
            ctx._buffer = tokens + ctx._buffer
            raise
        accepted = gen.accept(raw.tokens[handle.rows[0]]) if handle is not None else []
        return Output(raw, accepted, handle)


def _check_horizon(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise InvalidInput(f"horizon (expected output tokens) must be >= 1, got {n}")
    return n


def _check_max(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise InvalidInput(f"max_tokens must be >= 1, got {n}")
    return n
