"""Generators: the decode loop. ``g = ctx.generate(sampler, max_tokens=...)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from pie_core.host.errors import InvalidInput, Unsupported
from pie_core.host import model as _model
from inferlet.forward import Forward, Output, ProbeHandle
from inferlet.probes import Probe
from inferlet.sampler import Sampler

if TYPE_CHECKING:
    from inferlet.context import Context

__all__ = ["Generator", "GenStep"]

_LATER = ("constrain", "speculator", "system_speculation", "adapter", "zo_seed")


class Generator:
    """The decode loop of a context.

    Each step runs the context's buffered tokens (on the first step, the prompt; afterwards
    the last accepted token) and samples the next token. Accepted tokens go back into the
    context's buffer, so the context holds the whole conversation — except a final stop token,
    which is left out so that ``ctx.seal()`` can close the turn as the chat template does.

    Keyword options (all optional): ``max_tokens`` (stop after n accepted tokens), ``stop``
    (stop-token ids; with ``auto_flush`` they default to the chat format's), ``logit_mask``
    (BRLE applied every step), ``horizon`` (expected output length, a scheduling hint),
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
        self._ctx = ctx
        self._sampler = sampler
        self._max = _check_max(max_tokens)
        self._logit_mask = logit_mask
        self._horizon = horizon
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
        self._horizon = n
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
        dec = Decoder(self._ctx.model)
        parts: list[str] = []
        for tok in tokens:
            ev = dec.feed([tok])
            if isinstance(ev, Event.Done):
                return ev.text
            if isinstance(ev, Event.Delta):
                parts.append(ev.text)
        return "".join(parts)

    def accept(self, tokens: Iterable[int]) -> list[int]:
        """Register tokens picked by the caller (e.g. after ``clear_sampler``).

        Returns:
            The tokens actually accepted (cut at a stop token or ``max_tokens``).
        """
        accepted: list[int] = []
        for tok in tokens:
            if self._done:
                break
            accepted.append(int(tok))
            self._tokens.append(int(tok))
            if tok in self._stop or (self._max is not None and len(self._tokens) >= self._max):
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
        tokens = ctx._take_buffer()
        if not tokens:
            raise InvalidInput("nothing to run: the context buffer is empty (add a prompt or ctx.cue())")
        fwd = Forward(ctx).input(tokens)
        if gen._logit_mask is not None:
            fwd.mask(gen._logit_mask)
        handle = fwd.sample([len(tokens) - 1], gen._sampler) if self._sample else None
        for idx, probe in (*gen._each_step, *self._probes):
            fwd.probe(idx % len(tokens) if idx < 0 else idx, probe)
        self._executed = True
        try:
            raw = await fwd._submit()
        except BaseException:
            ctx._buffer = tokens + ctx._buffer
            raise
        accepted = gen.accept(raw.tokens[handle.rows[0]]) if handle is not None else []
        return Output(raw, accepted, handle)


def _check_max(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise InvalidInput(f"max_tokens must be >= 1, got {n}")
    return n
