"""The ``openai`` client against /v1/chat/completions on the real default model (cpu backend)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from pie_core.engine.engine import Engine
from pie_core.server import Authenticator, PieServer, ServerOptions
from pie_core.server.auth import User, hash_token

openai = pytest.importorskip("openai")


@pytest.mark.model
def test_openai_client_streaming_and_not_on_the_default_model(real_cpu_engine: Engine):
    engine = real_cpu_engine
    model = next(iter(engine.models))

    async def scenario() -> None:
        opts = ServerOptions(port=0, data_dir=Path(tempfile.mkdtemp(prefix="pie-srv-")), status_interval=0)
        server = PieServer(engine, opts, auth=Authenticator([User("dev", hash_token("sk-test"))]), close_engine=False)
        await server.start()
        try:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="sk-test")
            assert [m.id async for m in client.models.list()] == [model]
            ask = {"model": model, "messages": [{"role": "user", "content": "What is 2+2? Answer with one digit."}],
                   "max_tokens": 6, "temperature": 0}
            whole = await client.chat.completions.create(**ask)
            text = whole.choices[0].message.content
            assert "4" in text and whole.usage.completion_tokens <= 6
            stream = await client.chat.completions.create(**ask, stream=True)
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            assert len([p for p in parts if p]) >= 1 and "".join(parts) == text
            with pytest.raises(openai.AuthenticationError):
                bad = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="wrong")
                await bad.chat.completions.create(**ask)
        finally:
            await server.close()

    asyncio.run(scenario())
    assert engine.pools_whole()
