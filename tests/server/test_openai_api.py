"""The OpenAI API of ``pie serve`` through the official ``openai`` client (dummy backend), in every
isolation the server offers (in-process, worker processes, the wasm sandbox): chat and
completions whole and streamed, logprobs, n choices, tool calls, ``response_format``,
embeddings, many clients at once; bounds on each with clear 400s."""

from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import isolated
from server_helpers import http_request
from pie_core.backend_kit.dummy import _table, dummy_logits
from pie_core.server.openai_request import MAX_N, MAX_TOP_LOGPROBS

openai = pytest.importorskip("openai")

MSG = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["paris", "tokyo"]}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["oslo", "lima"]}}, "required": ["city"],
                   "additionalProperties": False}}}


@pytest.fixture(params=["inprocess", "process", "wasm"])
def served(request, served):
    """The server of conftest's ``served``, running its inferlets (the OpenAI handler among them)
    in each isolation ``pie serve`` offers: every request must work the same in each."""
    def run(scenario, **options):
        return served(scenario, launcher=isolated(request.param), **options)

    return run


def client(s, user: str = "alice"):
    return openai.AsyncOpenAI(base_url=s.http + "/v1", api_key=s.tokens[user], max_retries=0)


def _model(s) -> str:
    return next(iter(s.server.engine.models))


def test_chat_logprobs_cover_each_token_of_the_reply_whole_and_streamed(served):
    async def scenario(s):
        async with client(s) as c:
            ask = dict(model=_model(s), messages=MSG, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
            whole = await c.chat.completions.create(**ask)
            choice = whole.choices[0]
            items = choice.logprobs.content
            assert len(items) == whole.usage.completion_tokens == 6
            assert b"".join(bytes(i.bytes) for i in items).decode() == choice.message.content
            for item in items:
                assert item.logprob < 0 and len(item.top_logprobs) == 3
                tops = [t.logprob for t in item.top_logprobs]
                assert tops == sorted(tops, reverse=True)
                # greedy: the chosen token is the most likely one, with the same log-probability
                assert (item.top_logprobs[0].token, item.top_logprobs[0].logprob) == (item.token, item.logprob)
                assert sum(math.exp(t) for t in tops) < 1.0
            stream = await c.chat.completions.create(**ask, stream=True)
            streamed = [i async for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                        for i in chunk.choices[0].logprobs.content]
            assert [(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in items]
            plain = await c.chat.completions.create(**{**ask, "logprobs": False, "top_logprobs": None})
            assert plain.choices[0].logprobs is None and plain.choices[0].message.content == choice.message.content

    served(scenario)


def test_completion_logprobs_are_the_models_log_softmax_in_the_legacy_shape(served):
    async def scenario(s):
        model = s.server.engine.models[_model(s)]
        prompt = "The quick brown fox"
        ids = model.tokenizer.encode(prompt)
        logits = dummy_logits(_table(model.spec.vocab_size), np.array(ids[-1:]), np.array([len(ids) - 1]))[0]
        expect = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
        best = np.argsort(-expect)[:5]
        async with client(s) as c:
            # multinomial: the chosen token need not be among the top 5; its logprob is still exact
            reply = await c.completions.create(model=_model(s), prompt=prompt, max_tokens=4, logprobs=5, seed=7)
        lp = reply.choices[0].logprobs
        first = model.tokenizer.encode(lp.tokens[0])
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
        assert lp.token_logprobs[0] == pytest.approx(expect[first[0]], abs=1e-4)
        assert list(lp.top_logprobs[0].values()) == pytest.approx(list(expect[best]), abs=1e-4)
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        assert "".join(lp.tokens) == reply.choices[0].text

    served(scenario)


def test_n_choices_are_forks_of_one_prompt_each_with_its_index(served):
    async def scenario(s):
        async with client(s) as c:
            reply = await c.chat.completions.create(model=_model(s), messages=MSG, max_tokens=5, n=3, seed=11)
            assert [ch.index for ch in reply.choices] == [0, 1, 2]
            texts = [ch.message.content for ch in reply.choices]
            assert len(set(texts)) > 1  # each fork draws with its own seed
            assert reply.usage.completion_tokens == 15
            again = await c.chat.completions.create(model=_model(s), messages=MSG, max_tokens=5, n=3, seed=11)
            assert [ch.message.content for ch in again.choices] == texts  # a seed makes every choice repeatable
            stream = await c.chat.completions.create(model=_model(s), messages=MSG, max_tokens=5, n=3, seed=11,
                                                     stream=True)
            parts: dict[int, str] = {}
            finished = set()
            async for chunk in stream:
                for ch in chunk.choices:
                    parts[ch.index] = parts.get(ch.index, "") + (ch.delta.content or "")
                    if ch.finish_reason:
                        finished.add(ch.index)
            assert [parts[i] for i in range(3)] == texts and finished == {0, 1, 2}
            completion = await c.completions.create(model=_model(s), prompt="Once upon", max_tokens=3, n=2,
                                                    temperature=0)
            assert [ch.index for ch in completion.choices] == [0, 1]
            assert completion.choices[0].text == completion.choices[1].text  # greedy forks agree

    served(scenario)


def test_tool_choice_required_returns_a_tool_call_that_follows_the_schema(served):
    async def scenario(s):
        async with client(s) as c:
            reply = await c.chat.completions.create(model=_model(s), messages=MSG, max_tokens=80, temperature=0,
                                                    tools=[WEATHER, TIME], tool_choice="required")
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        if call.function.name == "get_weather":
            assert json.loads(call.function.arguments)["city"] in ("paris", "tokyo")
        else:
            assert call.function.name == "get_time" and json.loads(call.function.arguments)["city"] in ("oslo", "lima")

    served(scenario)


def test_a_named_tool_choice_streams_a_call_to_that_tool(served):
    async def scenario(s):
        async with client(s) as c:
            stream = await c.chat.completions.create(
                model=_model(s), messages=MSG, max_tokens=80, temperature=0, tools=[WEATHER, TIME], stream=True,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
            calls, content, finish = [], "", None
            async for chunk in stream:
                delta = chunk.choices[0].delta
                content += delta.content or ""
                calls += delta.tool_calls or []
                finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and "tool_call" not in content
        assert calls and calls[0].index == 0 and calls[0].function.name == "get_time"
        assert json.loads(calls[0].function.arguments)["city"] in ("oslo", "lima")

    served(scenario)


def test_tools_reach_the_prompt_and_a_tool_result_conversation_goes_on(served):
    async def scenario(s):
        async with client(s) as c:
            base = dict(model=_model(s), max_tokens=3, temperature=0)
            bare = await c.chat.completions.create(**base, messages=MSG)
            listed = await c.chat.completions.create(**base, messages=MSG, tools=[WEATHER], tool_choice="none")
            assert listed.usage.prompt_tokens > bare.usage.prompt_tokens + 20  # the template lists the tool
            assert listed.choices[0].message.tool_calls is None and listed.choices[0].finish_reason == "length"
            call = {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"paris\"}"}}
            history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
            answered = await c.chat.completions.create(**base, messages=history, tools=[WEATHER], tool_choice="none")
            assert answered.usage.prompt_tokens > listed.usage.prompt_tokens + 10
            with pytest.raises(openai.BadRequestError, match=r"messages\[2\].tool_call_id"):
                await c.chat.completions.create(**base, messages=[*history[:2], {**history[2], "tool_call_id": "x"}])

    served(scenario)


def test_embeddings_are_unit_vectors_in_input_order_as_floats_or_base64(served):
    async def scenario(s):
        model = s.server.engine.models[_model(s)]
        async with client(s) as c:
            texts = ["hello world", "a different text", "hello world"]
            b64 = await c.embeddings.create(model=_model(s), input=texts)  # the client asks for base64
            floats = await c.embeddings.create(model=_model(s), input=texts, encoding_format="float")
            ids = await c.embeddings.create(model=_model(s), input=[model.tokenizer.encode("hello world")],
                                            encoding_format="float")
        for reply in (b64, floats):
            vecs = [np.array(d.embedding) for d in reply.data]
            assert [d.index for d in reply.data] == [0, 1, 2] and len(vecs[0]) == model.spec.hidden_size
            assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs)
            assert np.allclose(vecs[0], vecs[2]) and not np.allclose(vecs[0], vecs[1])
        assert np.allclose(b64.data[1].embedding, floats.data[1].embedding, atol=1e-6)
        assert np.allclose(ids.data[0].embedding, floats.data[0].embedding)
        assert floats.usage.prompt_tokens == sum(len(model.tokenizer.encode(t)) for t in texts)

    served(scenario)


def test_response_format_json_schema_gives_a_reply_that_follows_it(served):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
              "required": ["ok", "color"], "additionalProperties": False}

    async def scenario(s):
        async with client(s) as c:
            fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
            for extra in ({"temperature": 0}, {"seed": 3}):
                reply = await c.chat.completions.create(model=_model(s), messages=MSG, max_tokens=60,
                                                        response_format=fmt, **extra)
                assert reply.choices[0].finish_reason == "stop"
                value = json.loads(reply.choices[0].message.content)
                assert isinstance(value["ok"], bool) and value["color"] in ("red", "blue") and len(value) == 2

    served(scenario)


def test_forty_clients_at_once_each_get_their_reply_whole_or_streamed_to_done(served):
    """Half the clients stream (each stream ends with ``[DONE]``), half do not; all at once."""

    def one(s, i):
        body = {"model": _model(s), "messages": [{"role": "user", "content": f"client {i}"}], "max_tokens": 5,
                "temperature": 0, "stream": bool(i % 2)}
        status, _, raw = http_request(s.http + "/v1/chat/completions", body, s.tokens["alice"])
        assert status == 200, raw
        if not body["stream"]:
            return json.loads(raw)["choices"][0]["message"]["content"]
        lines = [ln[6:] for ln in raw.decode().split("\n\n") if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]", lines[-3:]
        chunks = [json.loads(x) for x in lines[:-1]]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

    async def scenario(s):
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(40) as pool:
            texts = await asyncio.gather(*(loop.run_in_executor(pool, one, s, i) for i in range(40)))
        async with client(s) as c:  # greedy: each text is what the same request alone gives
            for i in (0, 1, 38, 39):
                alone = await c.chat.completions.create(model=_model(s), max_tokens=5, temperature=0,
                                                        messages=[{"role": "user", "content": f"client {i}"}])
                assert alone.choices[0].message.content == texts[i]

    served(scenario)


BAD = [
    ("chat", {"messages": MSG, "n": MAX_N + 1}, "n"),
    ("chat", {"messages": MSG, "n": 0}, "n"),
    ("chat", {"messages": MSG, "logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS + 1}, "top_logprobs"),
    ("chat", {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ("chat", {"messages": MSG, "logprobs": 1}, "logprobs"),
    ("chat", {"messages": MSG, "tool_choice": "required"}, "tool_choice"),
    ("chat", {"messages": MSG, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ("chat", {"messages": MSG, "tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0]"),
    ("chat", {"messages": MSG, "tools": [WEATHER, WEATHER]}, "tools[1]"),
    ("chat", {"messages": MSG, "tools": [WEATHER] * 200}, "tools"),
    ("chat", {"messages": MSG, "tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"messages": MSG, "tools": [WEATHER], "parallel_tool_calls": False}, "parallel_tool_calls"),
    ("completion", {"prompt": "a", "logprobs": MAX_TOP_LOGPROBS + 1}, "logprobs"),
    ("completion", {"prompt": "", "max_tokens": 2}, "prompt"),
    ("embed", {"input": []}, "input"),
    ("embed", {"input": ["a"] * 300}, "input"),
    ("embed", {"input": [[1, -2]]}, "input"),
    ("embed", {"input": "a", "dimensions": 8}, "dimensions"),
    ("embed", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
]


@pytest.mark.parametrize("endpoint,body,param", BAD, ids=[f"{e}-{p}-{i}" for i, (e, _, p) in enumerate(BAD)])
def test_out_of_bounds_fields_get_a_400_naming_them(served, endpoint, body, param):
    async def scenario(s):
        async with client(s) as c:
            path = {"chat": "/chat/completions", "completion": "/completions", "embed": "/embeddings"}[endpoint]
            with pytest.raises(openai.BadRequestError) as caught:
                await c.post(path, body=body, cast_to=object)
        assert caught.value.body["param"] == param, caught.value.body
        assert not s.server.processes.of_user("alice")

    served(scenario)
