"""Disconnects, shutdown, HTTP endpoints on the dummy backend, and the CLI."""

from __future__ import annotations

import asyncio
import json

import msgpack
from conftest import PROBE
from server_helpers import http_request, raw_connect, raw_request, wait_until

from pie_core.cli.main import main as pie_main
from pie_core.client import connect


def test_a_client_that_disconnects_mid_generation_frees_everything(served, dummy_engine):
    async def scenario(s):
        client = await connect(s.url, s.tokens["alice"])
        proc = await client.launch(await client.install(PROBE), {"mode": "generate", "max_tokens": 100_000})
        events = proc.events()
        assert (await events.__anext__()).value == "step 1"
        assert not dummy_engine.pools_whole()
        client._ws.transport.abort()  # drop the socket without a closing handshake
        await wait_until(lambda: len(s.server.processes) == 0)
        assert dummy_engine.pools_whole()
        async with await connect(s.url, s.tokens["alice"]) as again:  # the server keeps serving
            assert await (await again.launch("hello-world")).wait() == "hello world"

    served(scenario)


def test_shutdown_gives_running_inferlets_an_error_event(served):
    async def scenario(s):
        async with raw_connect(s.url, s.tokens["alice"]) as ws:
            reply = await raw_request(ws, {"type": "launch", "id": 1, "program": "interactive-chat"})
            assert reply["ok"], reply
            await wait_until(lambda: len(s.server.processes) == 1)
            closing = asyncio.create_task(s.server.close())
            # the server closes the socket cleanly after the last event: the loop ends, nothing raises
            frames = [msgpack.unpackb(message) async for message in ws]
            await closing
            close_code = ws.close_code
        assert frames[-1]["event"] == "error" and "server shutting down" in frames[-1]["value"]
        assert close_code == 1001, close_code  # going away: the server shuts down

    served(scenario)


def test_health_and_metrics(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            await (await client.launch(await client.install(PROBE), {"mode": "generate", "max_tokens": 3})).wait()
        status, _, body = await asyncio.to_thread(http_request, s.http + "/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, _, body = await asyncio.to_thread(http_request, s.http + "/metrics")
        assert status == 401 and b"authentication required" in body  # auth is on: /metrics needs a token too
        status, ctype, body = await asyncio.to_thread(http_request, s.http + "/metrics", None, s.tokens["alice"])
        text = body.decode()
        assert status == 200 and ctype.startswith("text/plain")
        samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
        for name in ("pie_batches_total", "pie_batch_size_bucket", "pie_queue_length", "pie_kv_pages_in_use",
                     "pie_tokens_per_second", "pie_processes"):
            assert name in samples, f"/metrics has no sample of {name}"
        batches = [line for line in text.splitlines() if line.startswith("pie_batches_total{")]
        assert float(batches[0].split()[-1]) >= 3
        status, _, body = await asyncio.to_thread(http_request, s.http + "/nope")
        assert status == 404 and b"no route GET /nope" in body

    served(scenario)


def test_chat_completions_on_the_dummy_backend(served):
    async def scenario(s):
        url = s.http + "/v1/chat/completions"
        tok = s.tokens["alice"]
        msg = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        status, _, body = await asyncio.to_thread(http_request, url, {"messages": msg, "max_tokens": 4, "temperature": 0}, tok)
        reply = json.loads(body)
        assert status == 200 and reply["object"] == "chat.completion"
        assert reply["usage"]["completion_tokens"] <= 4 and reply["choices"][0]["message"]["role"] == "assistant"
        status, ctype, body = await asyncio.to_thread(http_request, url, {"messages": msg, "max_tokens": 4, "temperature": 0,
                                                                   "stream": True,
                                                                   "stream_options": {"include_usage": True}}, tok)
        lines = [ln[6:] for ln in body.decode().split("\n\n") if ln.startswith("data: ")]
        assert ctype.startswith("text/event-stream") and lines[-1] == "[DONE]"
        chunks = [json.loads(x) for x in lines[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        # greedy: the stream says what the same request said unstreamed
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
        assert streamed == reply["choices"][0]["message"]["content"]
        assert chunks[-2]["choices"][0]["finish_reason"] == reply["choices"][0]["finish_reason"]
        assert chunks[-1]["usage"] == reply["usage"] and chunks[-1]["choices"] == []
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
        status, _, body = await asyncio.to_thread(http_request, url, {"messages": msg, "max_tokens": 40, "response_format": fmt}, tok)
        content = json.loads(body)["choices"][0]["message"]["content"]
        assert status == 200 and isinstance(json.loads(content)["ok"], bool)
        status, _, body = await asyncio.to_thread(http_request, url, {"messages": [{"role": "tool", "content": "x"}]}, tok)
        assert status == 400 and "messages[0].role" in json.loads(body)["error"]["message"]
        status, _, body = await asyncio.to_thread(http_request, url, {"model": "gpt-9", "messages": msg}, tok)
        assert status == 404 and "not served here" in json.loads(body)["error"]["message"]
        status, _, body = await asyncio.to_thread(http_request, s.http + "/v1/completions", {"prompt": "a", "max_tokens": 3}, tok)
        assert status == 200 and json.loads(body)["object"] == "text_completion"
        await wait_until(lambda: len(s.server.processes) == 0)

    served(scenario)


def test_stop_strings_cut_the_reply_and_are_never_streamed(served):
    async def scenario(s):
        url, tok = s.http + "/v1/chat/completions", s.tokens["alice"]
        msg = [{"role": "user", "content": "hi"}]
        greedy = {"messages": msg, "max_tokens": 12, "temperature": 0}
        _, _, body = await asyncio.to_thread(http_request, url, greedy, tok)
        full = json.loads(body)["choices"][0]["message"]["content"]
        _, _, again = await asyncio.to_thread(http_request, url, greedy, tok)
        assert json.loads(again)["choices"][0]["message"]["content"] == full  # greedy is repeatable
        stop = full[len(full) // 2 : len(full) // 2 + 3]
        expect = full[: full.index(stop)]
        _, _, body = await asyncio.to_thread(http_request, url, {**greedy, "stop": [stop]}, tok)
        choice = json.loads(body)["choices"][0]
        assert choice["message"]["content"] == expect and choice["finish_reason"] == "stop"
        _, _, body = await asyncio.to_thread(http_request, url, {**greedy, "stop": stop, "stream": True}, tok)
        chunks = [json.loads(x[6:]) for x in body.decode().split("\n\n") if x.startswith("data: {")]
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert streamed == expect and chunks[-1]["choices"][0]["finish_reason"] == "stop"

    served(scenario)


def test_no_auth_is_refused_off_loopback(capsys):
    assert pie_main(["serve", "--dummy", "--no-auth", "--host", "0.0.0.0"]) == 1
    assert "refusing --no-auth on 0.0.0.0" in capsys.readouterr().err


def test_auth_cli_adds_lists_and_removes_users_storing_only_hashes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIE_HOME", str(tmp_path))
    assert pie_main(["auth", "add", "carol"]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    text = (tmp_path / "config.toml").read_text()
    assert token.startswith("pie_") and token not in text and "token_sha256" in text
    assert pie_main(["auth", "list", "--json"]) == 0
    assert [u["name"] for u in json.loads(capsys.readouterr().out)] == ["carol"]
    from pie_core.server.auth import Authenticator

    assert Authenticator.from_config().check(token) == "carol"
    assert pie_main(["auth", "remove", "carol"]) == 0
    assert pie_main(["auth", "remove", "carol"]) == 1
    assert "no user 'carol'" in capsys.readouterr().err


def test_pie_run_server_uploads_a_folder_and_streams_its_output(served, capfd):
    async def scenario(s):
        argv = ["run", "--server", s.url, "--token", s.tokens["alice"], str(PROBE), "--", "--mode", "generate", "--max-tokens", "2"]
        assert await asyncio.to_thread(pie_main, argv) == 0
        bad = ["run", "--server", s.url, "--token", s.tokens["alice"], "ghost"]
        assert await asyncio.to_thread(pie_main, bad) == 1

    served(scenario)
    out, err = capfd.readouterr()
    assert "step 1step 2\n2\n" in out
    assert "no program 'ghost'" in err
