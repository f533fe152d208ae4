"""Generators: the decode loop. ``g = ctx.generate(sampler, max_tokens=...)``."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Protocol

from inferlet.host.errors import InvalidInput
from inferlet.host import model as _model
from inferlet.host import scheduling as _market
from inferlet import _blocking
from inferlet._keywords import renamed
from inferlet.cache import KvCache
from inferlet.constraints import ConstraintSet, as_schema, parse_json
from inferlet.forward import Forward, Output, ProbeHandle, SampleHandle, next_pass
from inferlet.pending import Pending
from inferlet.model import Model
from inferlet.probes import Probe
from inferlet.host.types import RequestOutput
from inferlet.sampler import Sampler
from inferlet.spec import Speculator

__all__ = ["Generator", "GenStep", "MAX_DRAFTS"]

MAX_DRAFTS = 16  # drafts verified per step (a speculator's further drafts count as not kept)
MAX_AHEAD = 2**31 - 1  # "no end in sight" for run-ahead (the host API takes a u32)
SYSTEM_DRAFTS = 8  # the most the system drafter proposes per step


class Generating(Protocol):
    """What a generator needs of its context (``inferlet.Context`` provides it)."""

    _kv: KvCache
    _pending: Pending

    @property
    def model(self) -> Model: ...

    def buffer(self) -> list[int]: ...

    def append(self, tokens: Iterable[int]) -> Any: ...

    def cue(self) -> Any: ...

    def forward(self, flush: bool = False) -> Forward: ...


class Generator:
    """The decode loop of a context.

    Each step runs the context's buffered tokens (on the first step, the prompt; afterwards
    the last accepted token) and samples the next token. Accepted tokens go back into the
    context's buffer, so the context holds the whole conversation.

    A stop token ends generation and is not an accepted token (the reference's "post stop
    truncation"): it is not in ``out.tokens``, :meth:`collect_tokens` or
    :attr:`tokens_generated`, does not count toward ``max_tokens``, and never enters the
    context (neither its buffer nor its KV cache), so that ``ctx.seal()`` can close the turn
    as the chat template does. :attr:`is_done` tells that generation ended.

    Drive it with ``async for step in g: out = await step.execute()``, with a collector
    (``await g.collect_tokens()``, ...), or, where the runner lets an inferlet block (the
    process and wasm runners, see :mod:`inferlet._blocking`), with the readme's
    ``for tokens in g`` (each step's accepted tokens) and the collectors called from
    synchronous code (``def main``), which return their values.

    Keyword options (all optional): ``max_tokens`` (stop after n accepted tokens), ``stop``
    (stop-token ids; with ``auto_flush`` they default to the chat format's), ``logit_mask``
    (BRLE applied every step), ``constrain`` (a Schema or Constraint, or a list of them, ANDed;
    see :mod:`inferlet.constraints`), ``speculator`` (a :class:`~inferlet.spec.Speculator`) or
    ``system_speculation=True`` (the runtime's n-gram drafter): several tokens per step, the
    same tokens (see :mod:`inferlet.spec`), ``horizon`` (the output length you expect: it feeds
    the KV-page market's default bid, see below), ``auto_flush`` (default True: append
    ``cue()`` first and use the chat stop tokens), ``adapter`` (a LoRA
    :class:`~inferlet.Adapter` for every step) and ``zo_seed`` (its zo perturbation seed for
    every step, see :mod:`inferlet.zo`).

    Before each step the generator tells the KV-page market (:mod:`inferlet.scheduling`) how
    many tokens it still expects: ``horizon`` minus the tokens accepted so far, or, without a
    horizon or once past it, ``max_tokens`` minus them. The context's default bid spreads the
    inferlet's credits over that many ticks, so a short generation bids more per page than a
    long one; with neither a horizon nor ``max_tokens`` the market assumes 256 tokens. The
    horizon is only this hint: it never stops generation. When the generator ends (a stop
    token, ``max_tokens``, a finished constraint) the expectation is withdrawn, so a context
    waiting between turns bids as if its output length were unknown (256 tokens).
    """

    def __init__(
        self,
        ctx: Generating,
        sampler: Sampler,
        *,
        max_tokens: int | None = None,
        stop: Iterable[int] | None = None,
        logit_mask: list[int] | None = None,
        horizon: int | None = None,
        auto_flush: bool = True,
        constrain: Any = None,
        speculator: Speculator | None = None,
        system_speculation: bool = False,
        adapter: Any = None,
        zo_seed: int | None = None,
    ) -> None:
        if not isinstance(sampler, Sampler):
            raise TypeError(f"generate() needs a Sampler, got {type(sampler).__name__}")
        if not sampler.draws_tokens:
            raise InvalidInput("Sampler.embedding() draws no token, so it cannot drive generate(); "
                               "read embeddings with fwd.sample(...) or g.probe_each_step(-1, Embedding())")
        if speculator is not None and system_speculation:
            raise InvalidInput("speculator= and system_speculation=True are mutually exclusive: pass one of them")
        if speculator is not None and not all(callable(getattr(speculator, m, None)) for m in ("draft", "accept")):
            raise TypeError(
                f"speculator= needs draft() and accept() methods (inferlet.spec.Speculator); "
                f"{type(speculator).__name__} lacks them"
            )
        self._ctx = ctx
        self._sampler = sampler
        self._config = 0  # bumped whenever the steps' pass would change (sampler, stop, adapter, probes, ...)
        self._loop: _Loop | None = None  # the decode loop the engine runs ahead of this generator
        self._max = _check_max(max_tokens)
        self._horizon = _check_horizon(horizon)
        self._speculator = speculator
        self._system_speculation = bool(system_speculation)
        self._adapter = adapter
        self._zo_seed = zo_seed or 0
        # constraints and the static logit mask, ANDed (see inferlet.constraints)
        self._rules = None if logit_mask is None else ConstraintSet(ctx.model, logit_mask)
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
        self._told: Any = None  # the context (its KvCache) the market last heard this generator's horizon on
        self._target: int | None = None  # the length it was told the context should reach

    # -- builder -----------------------------------------------------------------------------
    def max_tokens(self, n: int) -> Generator:
        """Hard cap on accepted tokens."""
        self._config += 1
        self._max = _check_max(n)
        return self

    def stop(self, tokens: Iterable[int]) -> Generator:
        """Replace the stop set."""
        self._config += 1
        self._stop = set(int(t) for t in tokens)
        return self

    def add_stop(self, tokens: Iterable[int]) -> Generator:
        """Add to the stop set."""
        self._config += 1
        self._stop.update(int(t) for t in tokens)
        return self

    def horizon(self, n: int) -> Generator:
        """Hint the expected output length: it feeds the KV-page market's default bid (see the
        class doc); unlike ``max_tokens`` it never stops generation."""
        self._horizon = _check_horizon(n)
        return self

    def adapter(self, a: Any) -> Generator:
        """Apply a LoRA :class:`~inferlet.Adapter` on every step (None = base weights)."""
        self._config += 1
        self._adapter = a
        return self

    def zo_seed(self, seed: int) -> Generator:
        """Run every step with the adapter perturbed by zo seed ``seed`` (see :mod:`inferlet.zo`)."""
        self._config += 1
        self._zo_seed = seed
        return self

    def constrain(self, c: Any) -> Generator:
        """Add a constraint (a Schema, a Constraint, or a list); ANDed with those attached."""
        self._config += 1
        if self._rules is None:
            self._rules = ConstraintSet(self._ctx.model)
        self._rules.add(c)
        return self

    @renamed(idx="index")
    def probe_each_step(self, index: int, probe: Probe) -> ProbeHandle:
        """Attach ``probe`` to input row ``index`` of every step (-1 = the sampled row)."""
        self._config += 1
        self._each_step.append((index, probe))
        return ProbeHandle(len(self._each_step) - 1, probe.spec(0).kind)

    # -- inspection --------------------------------------------------------------------------
    @property
    def tokens_generated(self) -> int:
        """Tokens accepted so far (a stop token is not one)."""
        return len(self._tokens)

    @property
    def is_done(self) -> bool:
        """True once a stop token or ``max_tokens`` ended generation."""
        return self._done

    @property
    def stop_tokens(self) -> frozenset[int]:
        """The stop set."""
        return frozenset(self._stop)

    # -- driving -----------------------------------------------------------------------------
    def __aiter__(self) -> Generator:
        return self

    async def __anext__(self) -> GenStep:
        if self._done:
            raise StopAsyncIteration
        return GenStep(self)

    def __iter__(self) -> Iterator[list[int]]:
        """``for tokens in g``: run step after step, blocking, and yield each step's accepted
        tokens (a step that accepted none, such as one that sampled only the stop token,
        yields nothing).

        Raises:
            Unsupported: The runner cannot block (in-process): write ``async for step in g``.
        """
        return _blocking.iterate(self._batches(), "for tokens in ctx.generate(...)",
                                 instead="async for step in ctx.generate(...)")

    async def _batches(self) -> AsyncIterator[list[int]]:
        async for step in self:
            tokens = (await step.execute()).tokens
            if tokens:
                yield tokens

    @_blocking.awaitable("g.collect_tokens()")
    async def collect_tokens(self) -> list[int]:
        """Run to the end; return every accepted token (a stop token is not one)."""
        async for step in self:
            await step.execute()
        return list(self._tokens)

    @_blocking.awaitable("g.collect_text()")
    async def collect_text(self) -> str:
        """Run to the end and return the reply text."""
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

    @_blocking.awaitable("g.collect_json()")
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

    @_blocking.awaitable("g.tokens()")
    async def tokens(self) -> list[int]:
        """Alias of :meth:`collect_tokens` (the readme's ``stream.tokens()``)."""
        return await self.collect_tokens()

    @_blocking.awaitable("g.text()")
    async def text(self) -> str:
        """Alias of :meth:`collect_text` (the readme's ``stream.text()``)."""
        return await self.collect_text()

    def accept(self, tokens: Iterable[int]) -> list[int]:
        """Register tokens picked by the caller (e.g. after ``clear_sampler``).

        Returns:
            The tokens actually accepted: cut before a stop token (which ends generation but
            is not accepted), at ``max_tokens``, and before a token the generator's
            constraints forbid.
        """
        accepted = self._fold(tokens)
        self._buffer(accepted)
        if self._speculator is not None and accepted:
            self._speculator.accept(list(accepted))
        return accepted

    def _fold(self, tokens: Iterable[int]) -> list[int]:
        """Advance the generator's state over ``tokens``; the ones accepted (a stop token ends
        generation without being accepted)."""
        accepted: list[int] = []
        for tok in map(int, tokens):
            if self._done:
                break
            if self._rules is not None:  # reconcile: a token the constraints forbid ends the list
                if not self._rules.admits(tok):
                    break
                self._rules.accept(tok)
            if tok in self._stop:
                self._done = True
                break
            accepted.append(tok)
            self._tokens.append(tok)
            if self._max is not None and len(self._tokens) >= self._max:
                self._done = True
            elif self._rules is not None and self._rules.ended:
                self._done = True
        if self._done and self._told is not None:
            self._withdraw()
        return accepted

    def _left(self) -> int | None:
        """Tokens it still expects (None: unknown)."""
        got = len(self._tokens)
        if self._horizon is not None and self._horizon > got:
            return self._horizon - got
        return None if self._max is None else max(0, self._max - got)

    def _announce(self, cache: KvCache, start: int) -> None:
        """Tell the market what this step's context should grow to. The target (length before
        the pass, ``start``, + tokens left) stays put from one plain decode step to the next,
        so this calls the host only on the first steps and when the expectation really changes."""
        left = self._left()
        target = None if left is None else start + left
        if cache is not self._told or target != self._target:
            _market.set_horizon(cache.handle_as_is(), left)
            self._told, self._target = cache, target

    def _withdraw(self) -> None:
        """Generation ended: the context no longer expects tokens from it."""
        cache, self._told, self._target = self._told, None, None
        if not cache.released:
            _market.set_horizon(cache.handle_as_is(), None)

    def _buffer(self, accepted: list[int]) -> None:
        self._ctx.append(accepted)  # the next step runs them (a stop token was never accepted)

    def _draft_room(self) -> int:
        """How many drafts the next step may verify (0: it runs without speculation)."""
        if self._speculator is None and not self._system_speculation:
            return 0
        s = self._sampler
        if s.draws != 1 or s.output != "token" or self._each_step:
            return 0
        if self._rules is not None and not self._rules.can_speculate:
            return 0
        room = MAX_DRAFTS if self._max is None else min(MAX_DRAFTS, self._max - len(self._tokens) - 1)
        return max(0, room)

    def _ahead(self) -> int:
        """How many more steps like the next one the engine may run ahead (0: none): steps whose
        pass is predictable from the token sampled before it, which constraints other than a
        static mask, drafts, per-step probes and multi-draw samplers make it not."""
        if self._speculator is not None or self._system_speculation or self._sampler.draws != 1:
            return 0
        if self._rules is not None and not self._rules.static:
            return 0
        if self._max is None:
            return MAX_AHEAD
        return max(0, min(MAX_AHEAD, self._max - len(self._tokens) - 1))


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

    @renamed(idx="index")
    def probe(self, index: int, probe: Probe) -> ProbeHandle:
        """Attach a probe for this iteration only (indices of the step's input; -1 = last).
        Handles number after the generator's ``probe_each_step`` probes."""
        self._probes.append((index, probe))
        return ProbeHandle(len(self._gen._each_step) + len(self._probes) - 1, probe.spec(0).kind)

    async def execute(self) -> Output:
        """Run the step's forward pass and fold the sampled tokens into the generator.

        Returns:
            The pass's output; ``out.tokens`` are the tokens the generator accepted this step
            (post stop and ``max_tokens`` truncation: a stop token is not among them).
        """
        if self._executed:
            raise InvalidInput("this generator step was already executed; take the next step")
        gen, ctx = self._gen, self._gen._ctx
        loop = gen._loop
        if loop is not None and self._sample and not self._probes and loop.continues(gen):
            self._executed = True
            gen._announce(loop.cache, loop.cache.length)
            return self._fold(await next_pass(loop.cache, ctx._pending, loop.token), loop.handle, [], [], loop)
        gen._loop = None
        mask = None
        if gen._rules is not None:  # compile (off the loop) and mask first: a dead end runs nothing
            await gen._rules.ready()
            mask = gen._rules.mask()
        fwd = ctx.forward(flush=True).adapter(gen._adapter).zo_seed(gen._zo_seed)
        n = len(ctx.buffer())
        if not n:
            raise InvalidInput("nothing to run: the context buffer is empty (add a prompt or ctx.cue())")
        gen._announce(fwd._cache, fwd.start_position())
        room = gen._draft_room() if self._sample and not self._probes else 0
        drafted, drafts, masks = self._drafts(fwd, n, room) if room else ([], [], [mask])
        for idx, probe in (*gen._each_step, *self._probes):
            fwd.probe(idx % n if idx < 0 else idx, probe)
        # after the probes: a Sampler.dist adds its own probe, which must not shift their handles
        handle = None
        if self._sample:
            fwd.draft(drafts)
            rows = [fwd.sample([n - 1 + i], gen._sampler, mask=m) for i, m in enumerate(masks)]
            handle = rows[0] if len(rows) == 1 else SampleHandle(tuple(r.rows[0] for r in rows))
            if not drafts and not self._probes and all(idx == -1 for idx, _ in gen._each_step):
                fwd._run_ahead(gen._ahead(), sorted(gen._stop))
        self._executed = True
        out = await fwd.execute()
        raw = out.raw
        if handle is None:
            return Output(raw, [], None)
        loop = _Loop(fwd._cache, handle, gen._config) if fwd._ahead else None
        return self._fold(raw, handle, drafted, drafts, loop)

    def _fold(self, raw: RequestOutput, handle: SampleHandle, drafted: list[int], drafts: list[int],
              loop: _Loop | None) -> Output:
        """Fold the step's sampled tokens into the generator (``drafted``: what the drafter
        proposed, ``drafts``: what the pass verified); ``loop`` is the decode loop the engine
        runs ahead from this step on, if any."""
        gen = self._gen
        if not drafts:
            run = list(raw.tokens[handle.rows[0]])
        else:
            run = [raw.tokens[r][0] for r in handle.rows[: raw.drafts_kept + 1]]
        accepted = gen._fold(run)
        gen._loop = loop.after(accepted, run) if loop is not None and not gen._done else None
        # drafts the context kept are in its KV already; the rest of the run waits in the buffer
        kept = raw.drafts_kept
        if len(accepted) < kept:  # the drafts were cut to make this impossible
            raise RuntimeError(f"generator bug: {kept} drafts kept in the KV but {len(accepted)} tokens accepted")
        gen._buffer(accepted[kept:])
        spec = gen._speculator
        if spec is not None:
            if accepted:
                spec.accept(list(accepted))
            rejected = len(drafted) - kept  # also when the step sampled only the stop token
            if rejected > 0 and callable(getattr(spec, "rollback", None)):
                spec.rollback(rejected)
        return Output(raw, accepted, handle)

    def _drafts(self, fwd: Forward, n: int, room: int) -> tuple[list[int], list[int], list[Any]]:
        """The step's drafts: what the drafter proposed, the usable prefix, and the mask for
        the row before each usable draft and after the last."""
        gen = self._gen
        if gen._speculator is not None:
            drafted, positions = gen._speculator.draft()
            drafted, positions = [int(t) for t in drafted], [int(p) for p in positions]
            start = fwd.start_position() + n
            if positions != list(range(start, start + len(drafted))):
                raise InvalidInput(
                    f"speculator.draft() must return one position per token, continuing the context from {start}; "
                    f"got tokens {drafted[:8]} at positions {positions[:8]}"
                )
        else:
            drafted = fwd.system_drafts(min(room, SYSTEM_DRAFTS))
        drafts = drafted[:room]
        if gen._rules is not None:
            masks = gen._rules.masks_along(drafts, gen._stop)
            drafts = drafts[: len(masks) - 1]
        else:  # a stop token can only end a step, never sit in the KV as a kept draft
            drafts = drafts[: next((i for i, t in enumerate(drafts) if t in gen._stop), len(drafts))]
            masks = [None] * (len(drafts) + 1)
        return drafted, drafts, masks


class _Loop:
    """What a generator remembers of the decode loop the engine runs ahead of it
    (``inferlet.host.inference.forward_next``): the context, its state when the loop's last pass
    landed, and the token that pass sampled. A step continues the loop only while nothing else
    happened: no other pass or change of the context, no change of the generator, and the
    buffer holds just that token."""

    __slots__ = ("cache", "handle", "config", "epoch", "token")

    def __init__(self, cache: KvCache, handle: SampleHandle, config: int) -> None:
        self.cache, self.handle, self.config = cache, handle, config
        self.epoch = cache.epoch
        self.token = -1

    def after(self, accepted: list[int], run: list[int]) -> _Loop | None:
        """The loop after a pass that sampled ``run`` and of which the generator accepted
        ``accepted``: it goes on when the one sampled token was accepted."""
        if len(run) != 1 or accepted != run:
            return None
        self.token, self.epoch = run[0], self.cache.epoch
        return self

    def continues(self, gen: Generator) -> bool:
        return (self.cache.epoch == self.epoch and self.config == gen._config and not gen._done
                and gen._ctx._pending.tokens() == [self.token])


def _check_horizon(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise InvalidInput(f"horizon (expected output tokens) must be >= 1, got {n}")
    return n


def _check_max(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise InvalidInput(f"max_tokens must be >= 1, got {n}")
    return n
