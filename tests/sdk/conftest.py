import asyncio
import dataclasses
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator
from unittest import mock

import pytest
from tokenizers import AddedToken, decoders, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from conformance.models import random_weights, tiny_spec
from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.hookspec import BackendOptions
from pie_core.models.chat_formats import chat_format_for
from pie_core.models.registry import ModelSource
from pie_core.models.tokenizer import Tokenizer
from pie_core.models.tokenizer_gguf import byte_to_unicode
from inferlet.host import transport as host_transport
from pie_core.runtime.inprocess import InProcessTransport
from pie_core.runtime.instance import run_main

TINY_PAGE_SIZE = 4  # small pages: a short prompt spans several, and most end mid-page
TINY_PAGES = 96

_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class Harness:
    """Runs inferlet mains on one engine and checks the page pools are whole afterwards."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model = next(iter(engine.models))

    def run(self, main: Callable[[dict], Awaitable[Any]], payload: dict | None = None) -> tuple[Event, list[Event]]:
        return asyncio.run(self.run_async(main, payload))

    async def run_async(self, main, payload=None) -> tuple[Event, list[Event]]:
        events: list[Event] = []
        final = await run_main(self.engine, main, payload or {}, events.append)
        return final, events

    def value(self, main, payload=None) -> Any:
        final, _ = self.run(main, payload)
        assert final.kind == "return", final.value
        return final.value

    @property
    def pool(self) -> Any:
        return self.engine.models[self.model].pool


class Observed:
    """A host transport over the engine's own (in-process) one that records every call and lets
    a test replace single host functions: the SDK is tested by swapping its transport, never by
    patching engine modules.

    Attributes:
        calls: Every ``(interface, name)`` called, in order.
    """

    blocking = None

    def __init__(self) -> None:
        self.base = InProcessTransport()
        self.calls: list[tuple[str, str]] = []
        self._overrides: dict[tuple[str, str], Callable[..., Any]] = {}

    def override(self, key: tuple[str, str], fn: Callable[..., Any]) -> None:
        """Serve host function ``key`` with ``fn`` (called with the declared arguments)."""
        self._overrides[key] = fn

    def call(self, key: tuple[str, str], args: tuple[Any, ...]) -> Any:
        self.calls.append(key)
        fn = self._overrides.get(key)
        return fn(*args) if fn is not None else self.base.call(key, args)

    def call_async(self, key: tuple[str, str], args: tuple[Any, ...]) -> Awaitable[Any]:
        self.calls.append(key)
        fn = self._overrides.get(key)
        return fn(*args) if fn is not None else self.base.call_async(key, args)

    def tell(self, key: tuple[str, str], args: tuple[Any, ...]) -> None:
        self.calls.append(key)
        fn = self._overrides.get(key)
        fn(*args) if fn is not None else self.base.tell(key, args)


@pytest.fixture
def observed() -> Iterator[Observed]:
    """Installs an :class:`Observed` transport for the test (inferlets run in-process over it)."""
    transport = Observed()
    previous = host_transport.install(transport)
    yield transport
    if previous is None:
        host_transport.uninstall()
    else:
        host_transport.install(previous)


@pytest.fixture(scope="session")
def dummy_engine() -> Engine:
    engine = Engine("dummy")
    engine.load(None)
    return engine


@pytest.fixture
def dummy(dummy_engine: Engine):
    harness = Harness(dummy_engine)
    yield harness
    assert dummy_engine.pools_whole(), "a test left KV pages allocated"


def _byte_tokenizer() -> Tokenizer:
    """A byte-level tokenizer: one token per byte (ids 0..255) plus ChatML's two specials."""
    chars = list(byte_to_unicode().values())
    inner = HFTokenizer(BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    inner.decoder = decoders.ByteLevel()
    inner.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return Tokenizer(inner, "byte_level", eos_ids=[257], chat_template=_CHATML)


def tiny_source() -> ModelSource:
    """conformance's tiny qwen2 with random weights, its vocabulary widened to a byte tokenizer."""
    spec = dataclasses.replace(tiny_spec("qwen2"), vocab_size=258)
    tokenizer = _byte_tokenizer()
    return ModelSource(
        name="tiny-qwen2",
        path=Path("tiny-qwen2"),
        format="hf",
        spec=spec,
        tokenizer=tokenizer,
        chat=chat_format_for(spec.arch, tokenizer, tokenizer.chat_template),
        cache_key="",
        _produce=lambda **_: random_weights(spec, seed=1),
    )


@pytest.fixture(scope="session")
def cpu_engine() -> Engine:
    """The cpu backend on a tiny random model: its output depends on every KV slot, so a test of
    forks, snapshots, truncation or prefix reuse fails when the wrong pages are read."""
    engine = Engine("cpu", options=BackendOptions(dtype="float32", page_size=TINY_PAGE_SIZE, kv_pages=TINY_PAGES,
                                                  host_pages=0))
    source = tiny_source()
    with mock.patch("pie_core.models.registry.resolve_model", lambda name=None, config=None: source):
        engine.load(source.name)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture
def cpu(cpu_engine: Engine):
    """A harness on :func:`cpu_engine`; the test must leave the pool whole and the cache empty of
    anything still held."""
    harness = Harness(cpu_engine)
    yield harness
    assert cpu_engine.pools_whole(), "a test left KV pages allocated"
    harness.pool.cache.clear()  # the next test starts without cached prefixes
