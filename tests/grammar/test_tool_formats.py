"""Tool turns equal each family's Jinja template with tools; calls parse; the native call
grammar accepts the template's own call text and nothing outside the tools.

Qwen 2.5 is the default model's own vocabulary. No Qwen 3 or Llama 3 checkpoint is available
offline, so, as in ``tests/models/test_chat_formats_more.py``, their formats run on the Qwen 2.5
vocabulary with the families' control tokens added.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from pie_core.errors import InvalidInput
from pie_core.grammar import Matcher, compiler_for, tool_call_source
from pie_core.models.chat_formats import (
    LLAMA3_TEMPLATE,
    QWEN3_TEMPLATE,
    ChatFormat,
    chat_format_for,
    render_chat_template,
)
from pie_core.models.chat_formats.llama3 import DEFAULT_DATE
from pie_core.models.chat_formats.tool_calls import (
    format_tool_call,
    normalize_tools,
    parse_tool_calls,
    tool_call_syntax,
)
from pie_core.models.registry import resolve_model
from pie_core.models.tokenizer import Tokenizer

TOOLS = normalize_tools([
    {"name": "get_weather", "description": "Weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    json.dumps({"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}),
])
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|eom_id|>"]


def _with_tokens(base: Tokenizer, tokens: list[str], special: bool, bos: str | None = None) -> Tokenizer:
    inner = HFTokenizer.from_str(base.inner.to_str())
    inner.add_tokens([AddedToken(t, special=special, normalized=False) for t in tokens if inner.token_to_id(t) is None])
    bos_id = inner.token_to_id(bos) if bos is not None else None
    return Tokenizer(inner, base.kind, bos_id=bos_id, eos_ids=base.eos_ids, split_regex=base.split_regex())


@pytest.fixture(scope="module")
def qwen2() -> ChatFormat:
    return resolve_model(None).chat


@pytest.fixture(scope="module")
def qwen3(qwen2: ChatFormat) -> ChatFormat:
    return chat_format_for("qwen3", _with_tokens(qwen2.tokenizer, ["<think>", "</think>"], special=False), None)


@pytest.fixture(scope="module")
def llama3(qwen2: ChatFormat) -> ChatFormat:
    tok = _with_tokens(qwen2.tokenizer, LLAMA_SPECIALS, special=True, bos="<|begin_of_text|>")
    return chat_format_for("llama", tok, LLAMA3_TEMPLATE)


def _render(fmt: ChatFormat, messages: list[dict], **kw) -> list[int]:
    assert fmt.template is not None
    extra = {"bos_token": "<|begin_of_text|>", "date_string": DEFAULT_DATE} if fmt.name == "llama3" else {}
    return fmt.tokenizer.encode(render_chat_template(fmt.template, messages, tools=TOOLS, **extra, **kw))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_consecutive_tool_results_share_one_turn_like_the_template(family, request):
    fmt = request.getfixturevalue(family)
    call = format_tool_call(tool_call_syntax(fmt), "get_weather", {"city": "Paris"})
    b = fmt.builder()
    ids = b.equip(TOOLS) + b.user("Weather in Paris? And 2+3?") + b.assistant(call)
    ids += b.answer("get_weather", {"sky": "clear"}) + b.answer("add", "5")
    assert fmt.tokenizer.decode(ids).endswith("</tool_call><|im_end|>\n")  # the results wait ...
    ids += b.cue()  # ... which writes them as one turn
    messages = [{"role": "user", "content": "Weather in Paris? And 2+3?"}, {"role": "assistant", "content": call},
                {"role": "tool", "content": '{"sky": "clear"}'}, {"role": "tool", "content": "5"}]
    assert ids == _render(fmt, messages, add_generation_prompt=True)
    # out of conversation (tools.answer_prefix) a result is a whole turn at once
    single = _render(fmt, [{"role": "user", "content": "u"}, {"role": "tool", "content": "5"}])
    assert single[-len(fmt.answer("add", "5")):] == fmt.answer("add", "5")


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_llama3_builder_lists_tools_in_the_first_user_message_like_the_template(llama3, system):
    b = llama3.builder()
    ids = b.equip(TOOLS, system) + b.user("  Weather in Paris?  ")
    call = format_tool_call(tool_call_syntax(llama3), "get_weather", {"city": "Paris"})
    ids += b.assistant(call) + b.answer("get_weather", {"sky": "clear"}) + b.answer("add", "five") + b.cue()
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": "user", "content": "  Weather in Paris?  "},
        {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": {"sky": "clear"}},
        {"role": "tool", "content": "five"},
    ]
    assert ids == _render(llama3, messages, add_generation_prompt=True)


def test_llama3_prefix_out_of_conversation_lists_tools_in_the_system_turn(llama3):
    ids = llama3.equip(TOOLS) + llama3.user("Weather in Paris?") + llama3.cue()
    expected = _render(llama3, [{"role": "user", "content": "Weather in Paris?"}], add_generation_prompt=True,
                       tools_in_user_message=False)
    assert ids == expected


def test_llama3_needs_the_user_message_right_after_equip(llama3):
    b = llama3.builder()
    b.equip(TOOLS)
    with pytest.raises(InvalidInput, match="first user message"):
        b.cue()
    b2 = llama3.builder()
    b2.user("hi")
    with pytest.raises(InvalidInput, match="equip tools first"):
        b2.equip(TOOLS)


def test_each_family_has_its_call_syntax(qwen2, qwen3, llama3):
    assert (tool_call_syntax(qwen2).style, tool_call_syntax(qwen2).reasoning) == ("qwen", False)
    assert (tool_call_syntax(qwen3).style, tool_call_syntax(qwen3).reasoning) == ("qwen", True)
    assert (tool_call_syntax(llama3).style, tool_call_syntax(llama3).args_key) == ("llama", "parameters")


def test_calls_parse_into_name_and_json_args(qwen2, llama3):
    qwen, llama = tool_call_syntax(qwen2), tool_call_syntax(llama3)
    text = ("Let me check.\n" + format_tool_call(qwen, "get_weather", {"city": "Paris"}) + "\n"
            + format_tool_call(qwen, "add", {"a": 2, "b": 3}) + "\n<tool_call>\n{\"name\": \"add\"")
    assert parse_tool_calls(qwen, text) == [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 2, "b": 3}')]
    assert parse_tool_calls(llama, 'Sure: {"name": "add", "parameters": {"a": 1, "b": 2}} done') == [
        ("add", '{"a": 1, "b": 2}')]
    assert parse_tool_calls(llama, '{"name": "add", "parameters": {"a": 1') == []
    with pytest.raises(InvalidInput, match="not valid JSON"):
        parse_tool_calls(qwen, "<tool_call>\n{name: add}\n</tool_call>")
    with pytest.raises(InvalidInput, match="'arguments' must be a JSON object"):
        parse_tool_calls(qwen, '<tool_call>{"name": "add", "arguments": 3}</tool_call>')


def test_tool_schemas_are_normalised_or_rejected_clearly():
    assert TOOLS[0] == {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    for bad, message in [
        ('{"type": "function"}', "needs a non-empty string 'name'"),
        ("{not json", "not valid JSON"),
        ({"name": "x", "parameters": "none"}, "'parameters' must be a JSON schema object"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            normalize_tools([bad])
    with pytest.raises(InvalidInput, match="two tools are named 'x'"):
        normalize_tools([{"name": "x"}, {"name": "x"}])
    with pytest.raises(InvalidInput, match="must be a list"):
        normalize_tools('{"name": "x"}')


def _matcher(fmt: ChatFormat, choice: str = "auto") -> Matcher:
    src = tool_call_source(tool_call_syntax(fmt), TOOLS, choice)
    vocab = len(fmt.tokenizer.vocabs()[0])
    stops = fmt.stop_tokens
    return Matcher(compiler_for(fmt.tokenizer, vocab, stops).compile_blocking(src), vocab, "tool calls")


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama3"])
def test_native_grammar_accepts_the_templates_call_text_and_nothing_else(family, request):
    fmt = request.getfixturevalue(family)
    syntax = tool_call_syntax(fmt)
    call = format_tool_call(syntax, "add", {"a": 2, "b": 3})
    m = _matcher(fmt)
    m.accept(fmt.tokenizer.encode(call))
    assert m.can_end and m.allows(fmt.stop_tokens[0])
    wrong_tool = format_tool_call(syntax, "delete_everything", {})
    with pytest.raises(InvalidInput, match="not allowed by the tool calls"):
        _matcher(fmt).accept(fmt.tokenizer.encode(wrong_tool))
    wrong_args = format_tool_call(syntax, "add", {"a": "two", "b": 3})
    with pytest.raises(InvalidInput, match="not allowed"):
        _matcher(fmt).accept(fmt.tokenizer.encode(wrong_args))
    required = _matcher(fmt, "required")
    assert not required.can_end  # at least one call
    with pytest.raises(InvalidInput):
        required.accept(fmt.tokenizer.encode("Hello there, ") + [fmt.stop_tokens[0]])
    forced = _matcher(fmt, "get_weather")
    with pytest.raises(InvalidInput):
        forced.accept(fmt.tokenizer.encode(call))


def test_qwen3_grammar_lets_the_model_think_first(qwen3):
    m = _matcher(qwen3, "required")
    call = format_tool_call(tool_call_syntax(qwen3), "get_weather", {"city": "Oslo"})
    m.accept(qwen3.tokenizer.encode("<think>\nThe user wants weather.\n</think>\n\n" + call))
    assert m.can_end


def test_a_bad_choice_is_a_clear_error(qwen2):
    with pytest.raises(InvalidInput, match="choice must be 'auto', 'required' or a tool name"):
        tool_call_source(tool_call_syntax(qwen2), TOOLS, "sometimes")
    with pytest.raises(InvalidInput, match="at least one tool"):
        tool_call_source(tool_call_syntax(qwen2), [], "auto")
