"""Chat builders produce exactly the tokens of the model's own Jinja template."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_testing import BASE_CONVERSATIONS, build_conversation

from pie_core.errors import InvalidInput, Unsupported
from pie_core.models.chat_formats import (
    ChatFormat,
    ChatMLFormat,
    GemmaFormat,
    TemplateFormat,
    chat_format_for,
    render_chat_template,
)
from pie_core.models.tokenizer import Tokenizer

pytestmark = pytest.mark.model

CONVERSATIONS = [
    *BASE_CONVERSATIONS,
    [("system", "S"), ("user", "<tool_call> literal"), ("assistant", "<div>x</div>\n\n\n")],
]


@pytest.fixture(scope="module")
def model(real_gguf: tuple[str, Path]) -> tuple[str, Tokenizer, ChatFormat]:
    arch, path = real_gguf
    tokenizer = Tokenizer.from_gguf(path)
    return arch, tokenizer, chat_format_for(arch, tokenizer, tokenizer.chat_template)


def _reference(fmt: ChatFormat, tok: Tokenizer, messages: list[dict[str, str]], cue: bool) -> list[int]:
    assert fmt.template is not None
    text = render_chat_template(fmt.template, messages, add_generation_prompt=cue,
                                bos_token=tok.id_to_token(tok.bos_id) or "")
    return tok.encode(text)


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=lambda c: "-".join(r for r, _ in c))
def test_builder_equals_the_jinja_template(model: tuple[str, Tokenizer, ChatFormat], conversation: list) -> None:
    _, tok, fmt = model
    ids, messages, cue = build_conversation(fmt.builder(), conversation)
    assert ids == _reference(fmt, tok, messages, cue), tok.decode(ids)


def test_seal_closes_the_turn_like_an_assistant_message(model: tuple[str, Tokenizer, ChatFormat]) -> None:
    _, tok, fmt = model
    builder = fmt.builder()
    ids = builder.user("Hello") + builder.cue()
    reply = "Hi! How can I help?"
    ids += tok.encode(reply) + builder.seal() + builder.user("Bye") + builder.cue()
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": reply}, {"role": "user", "content": "Bye"}]
    assert ids == _reference(fmt, tok, messages, True)


def test_family_and_stop_tokens(model: tuple[str, Tokenizer, ChatFormat]) -> None:
    arch, tok, fmt = model
    if arch == "qwen2":
        assert isinstance(fmt, ChatMLFormat)
        assert fmt.stop_tokens == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
        assert fmt.default_system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        assert tok.decode(fmt.user("hi")) == "<|im_start|>user\nhi<|im_end|>\n"
        assert tok.decode(fmt.cue()) == "<|im_start|>assistant\n" and tok.decode(fmt.seal()) == "<|im_end|>\n"
    else:
        assert isinstance(fmt, GemmaFormat)
        assert fmt.stop_tokens == (tok.token_to_id("<end_of_turn>"), tok.token_to_id("<eos>"))
        assert tok.decode(fmt.assistant(" x ")) == "<start_of_turn>model\nx<end_of_turn>\n"
        assert fmt.builder().system("sys") == [tok.bos_id]  # held for the first turn


def test_template_driven_format_agrees_with_the_family_builder(model: tuple[str, Tokenizer, ChatFormat]) -> None:
    _, tok, fmt = model
    assert fmt.template is not None
    generic = TemplateFormat(tok, fmt.template, fmt.stop_tokens)
    for conversation in CONVERSATIONS:
        a, b = fmt.builder(), generic.builder()
        for role, text in conversation:
            if role == "cue":
                assert a.cue() == b.cue()
                assert a.seal() == b.seal()
            else:
                assert getattr(a, role)(text) == getattr(b, role)(text)


def test_template_errors_become_invalid_input(model: tuple[str, Tokenizer, ChatFormat]) -> None:
    _, tok, fmt = model
    with pytest.raises(InvalidInput, match="rejected"):
        render_chat_template("{{ raise_exception('nope') }}", [])


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_tool_equip_and_answer_equal_the_template(model: tuple[str, Tokenizer, ChatFormat], system: str | None) -> None:
    arch, tok, fmt = model
    if arch != "qwen2":
        with pytest.raises(Unsupported):
            fmt.builder().equip(TOOLS)
        return
    assert fmt.tool_call_markers == ("<tool_call>", "</tool_call>")
    b = fmt.builder()
    ids = b.equip(TOOLS, system) + b.user("Weather in Paris?") + b.assistant(CALL)
    ids += b.answer("get_weather", {"temp": 21, "sky": "clear"}) + b.cue()
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": CALL},
                 {"role": "tool", "content": '{"temp": 21, "sky": "clear"}'}]
    assert fmt.template is not None
    expected = render_chat_template(fmt.template, messages, tools=TOOLS, add_generation_prompt=True)
    assert ids == tok.encode(expected)
