"""Compiling grammars for one model's vocabulary: cached, off the event loop, under a time limit.

Compilation (turning a grammar into per-state token masks for a 150k-token vocabulary) takes
milliseconds to seconds, so it never runs on the event loop: :meth:`GrammarCompiler.submit`
hands it to a small thread pool shared by every model, and callers wait for the result with
:meth:`GrammarCompiler.compile` (async) or :meth:`GrammarCompiler.compile_blocking`, each under
a time limit. A wait that runs out raises :class:`~pie_core.errors.InvalidInput` saying the
grammar is too complex for the limit; the compilation itself goes on in the background and its
result lands in the cache, so asking again later may succeed.

One :class:`GrammarCompiler` exists per (tokenizer, vocabulary size, stop tokens)
(:func:`compiler_for`); it keeps the last :data:`CACHE_SIZE` compiled grammars by source.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Iterable

from pie_core.grammar.lazy_xgr import xgr

from pie_core.errors import InvalidInput
from pie_core.grammar.source import GrammarSource, build, clean_error
from pie_core.grammar.vocab import tokenizer_info
from pie_core.models.tokenizer import Tokenizer
from pie_core.threads import lower_priority

__all__ = ["GrammarCompiler", "compiler_for", "check_timeout", "DEFAULT_TIMEOUT_S", "CACHE_SIZE", "COMPILE_THREADS"]

DEFAULT_TIMEOUT_S = 20.0
"""How long a caller waits for one grammar to compile unless it says otherwise."""

CACHE_SIZE = 128
"""Compiled grammars kept per compiler (least recently used dropped first)."""

COMPILE_THREADS = 2
QUEUE_WAIT_S = 60.0
"""How long a grammar may wait for a compile thread (or its time limit, if longer) before the
compile is refused as busy: the time limit itself counts from the compilation's start."""
_POLL_S = 0.5
"""Worker threads compiling grammars, shared by every model."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="pie-grammar",
                                       initializer=lower_priority)  # see pie_core.threads
        return _pool


class GrammarCompiler:
    """Compiles grammar sources against one vocabulary and caches the results."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: Iterable[int]) -> None:
        """Bind to a vocabulary; nothing is built until the first compilation.

        Args:
            tokenizer: The model's tokenizer.
            vocab_size: The model's vocabulary size (mask width).
            stop_ids: Tokens allowed where the grammar can end.
        """
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_ids = tuple(sorted(set(int(s) for s in stop_ids)))
        self._lock = threading.Lock()  # guards the cache; held only briefly (the loop takes it)
        self._build_lock = threading.Lock()  # guards building the vocabulary (seconds, in a worker)
        self._cache: OrderedDict[GrammarSource, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._xgr: xgr.GrammarCompiler | None = None
        self._started: dict[GrammarSource, float] = {}  # running compilations: time.monotonic() at start

    def submit(self, source: GrammarSource, user: str | None = None) -> Future[xgr.CompiledGrammar]:
        """Start compiling ``source`` (or return the cached/in-flight compilation); ``user``'s
        compilations run one after another (:func:`_in_turn`)."""
        with self._lock:
            found = self._cache.get(source)
            if found is not None:
                self._cache.move_to_end(source)
                return found
            future = _in_turn(user, lambda: self._compile(source))
            self._cache[source] = future
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return future

    async def compile(self, source: GrammarSource, timeout: float | None = None) -> xgr.CompiledGrammar:
        """Compile without blocking the event loop.

        Args:
            source: The grammar.
            timeout: Seconds the compilation may run (default :data:`DEFAULT_TIMEOUT_S`),
                counted from when a compile thread starts it: a grammar queued behind others (at
                most :data:`QUEUE_WAIT_S` more) is not judged too complex for the wait.

        Raises:
            InvalidInput: The grammar does not compile, or not within ``timeout``, or the compile
                threads stayed busy with other grammars.
        """
        limit = check_timeout(timeout)
        future = self.submit(source)
        queued = time.monotonic()
        while not future.done():
            await _wait(future, self._remaining(source, limit, queued))
        return future.result()

    def compile_blocking(self, source: GrammarSource, timeout: float | None = None) -> xgr.CompiledGrammar:
        """Compile, blocking the calling thread (for synchronous APIs); same limits and errors as
        :meth:`compile`."""
        limit = check_timeout(timeout)
        future = self.submit(source)
        queued = time.monotonic()
        while True:
            try:
                return future.result(timeout=self._remaining(source, limit, queued))
            except FutureTimeout:
                pass

    def _remaining(self, source: GrammarSource, limit: float, queued: float) -> float:
        """Seconds to wait for ``source`` before looking again (at most :data:`_POLL_S`).

        Raises:
            InvalidInput: It ran ``limit`` seconds, or waited :data:`QUEUE_WAIT_S` (at least
                ``limit``) for a thread.
        """
        now = time.monotonic()
        started = self._started.get(source)
        if started is not None:
            left = started + limit - now
            if left <= 0:
                raise _too_slow(source, limit)
        else:
            left = queued + max(limit, QUEUE_WAIT_S) - now
            if left <= 0:
                raise InvalidInput(
                    f"the {source.describe()} waited {max(limit, QUEUE_WAIT_S):g} s for a compile thread: the "
                    "grammar compiler is busy with other grammars; try again"
                )
        return min(left, limit, _POLL_S)  # looks again within the limit of a compilation that starts meanwhile

    def cached(self, source: GrammarSource) -> bool:
        """Whether ``source`` has compiled successfully and is in the cache."""
        with self._lock:
            found = self._cache.get(source)
        return found is not None and found.done() and found.exception() is None

    def _compile(self, source: GrammarSource) -> xgr.CompiledGrammar:
        self._started[source] = time.monotonic()
        try:
            grammar = build(source)
            return self._compiler().compile_grammar(grammar)
        except (RuntimeError, ValueError) as e:
            raise InvalidInput(f"cannot compile the {source.describe()}: {clean_error(e)}") from None
        finally:
            self._started.pop(source, None)

    def _compiler(self) -> xgr.GrammarCompiler:
        with self._build_lock:
            if self._xgr is None:
                info = tokenizer_info(self.tokenizer, self.vocab_size, self.stop_ids)
                self._xgr = xgr.GrammarCompiler(info, max_threads=COMPILE_THREADS, cache_enabled=False)
            return self._xgr


_tails: dict[str, Future[Any]] = {}  # per user: its latest compilation, which the next one waits for
_tails_lock = threading.Lock()


def _in_turn(user: str | None, fn: Callable[[], Any]) -> Future[Any]:
    """``fn`` in a compile thread, after ``user``'s previous compilation ended: one user holds at
    most one of the :data:`COMPILE_THREADS` at a time (until its xgrammar call returns, which a
    timeout does not stop), so a user's slow grammars delay only that user's others."""
    if user is None:
        return _executor().submit(fn)
    result: Future[Any] = Future()

    def start(_: object = None) -> None:
        inner = _executor().submit(fn)
        inner.add_done_callback(lambda f: _settle(result, f))

    with _tails_lock:
        previous = _tails.get(user)
        _tails[user] = result
    result.add_done_callback(lambda f: _forget_tail(user, f))
    if previous is None:
        start()
    else:
        previous.add_done_callback(start)  # at once if it is done already
    return result


def _settle(result: Future[Any], inner: Future[Any]) -> None:
    exc = inner.exception()
    if exc is not None:
        result.set_exception(exc)
    else:
        result.set_result(inner.result())


def _forget_tail(user: str, done: Future[Any]) -> None:
    with _tails_lock:
        if _tails.get(user) is done:
            del _tails[user]


def check_timeout(timeout: float | None) -> float:
    """``timeout`` in seconds, or the default for None.

    Raises:
        InvalidInput: Not a positive number.
    """
    try:
        limit = DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
    except (TypeError, ValueError):
        limit = float("nan")
    if not limit > 0:
        raise InvalidInput(f"compile timeout must be > 0 seconds, got {timeout}")
    return limit


def _too_slow(source: GrammarSource, limit: float) -> InvalidInput:
    return InvalidInput(
        f"the {source.describe()} did not compile within {limit:g} s: it is too complex for the time "
        "limit; simplify it (fewer alternatives, smaller repetition bounds, fewer nested anyOf) or "
        "pass a larger compile_timeout"
    )


async def _wait(future: Future[xgr.CompiledGrammar], seconds: float) -> None:
    """Until ``future`` is done or ``seconds`` passed, without blocking the loop."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake(_: object) -> None:  # runs in the worker thread; the loop may be gone by then
        try:
            loop.call_soon_threadsafe(_resolve, woken)
        except RuntimeError:
            pass

    future.add_done_callback(wake)
    try:
        await asyncio.wait_for(woken, seconds)
    except TimeoutError:
        pass


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_compilers: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[int, tuple[int, ...]], GrammarCompiler]] = (
    weakref.WeakKeyDictionary()
)
_compilers_lock = threading.Lock()


def compiler_for(tokenizer: Tokenizer, vocab_size: int, stop_ids: Iterable[int]) -> GrammarCompiler:
    """The shared compiler of a (tokenizer, vocabulary size, stop tokens) triple."""
    stops = tuple(sorted(set(int(s) for s in stop_ids)))
    with _compilers_lock:
        per_tokenizer = _compilers.setdefault(tokenizer, {})
        key = (int(vocab_size), stops)
        if key not in per_tokenizer:
            per_tokenizer[key] = GrammarCompiler(tokenizer, vocab_size, stops)
        return per_tokenizer[key]
