"""Qwen 3 and Llama 3 builders produce exactly the tokens of the families' published templates.

No Qwen 3 or Llama 3 checkpoint is available offline, so the tests use the default model's
Qwen 2.5 vocabulary (the family Qwen 3's vocabulary extends) with the missing control tokens
added: ``<think>``/``</think>`` (plain added tokens, as in Qwen 3) for Qwen 3, and the Llama 3
header/turn tokens (special) for Llama 3. Every conversation boundary is a control token, so
the ids equal those of the real vocabularies up to the ids of the tokens themselves.
"""

from __future__ import annotations

import pytest
from chat_testing import BASE_CONVERSATIONS, build_conversation
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from pie_core.errors import Unsupported
from pie_core.models.chat_formats import (
    LLAMA3_TEMPLATE,
    QWEN3_TEMPLATE,
    ChatMLFormat,
    Llama3Format,
    Qwen3Format,
    TemplateFormat,
    chat_format_for,
    render_chat_template,
)
from pie_core.models.chat_formats.llama3 import DEFAULT_DATE
from pie_core.models.registry import resolve_model
from pie_core.models.tokenizer import Tokenizer

pytestmark = pytest.mark.model

LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|eom_id|>"]

REASONED = "<think>\nLet me add.\n2+2 is 4.\n</think>\n\nIt is 4."

CONVERSATIONS = [
    *BASE_CONVERSATIONS,
    [("system", "S"), ("user", "2+2?"), ("assistant", REASONED), ("user", "and 3+3?"), ("cue", None)],
]


def _with_tokens(base: Tokenizer, tokens: list[str], special: bool, bos: str | None = None) -> Tokenizer:
    inner = HFTokenizer.from_str(base.inner.to_str())
    inner.add_tokens([AddedToken(t, special=special, normalized=False) for t in tokens if inner.token_to_id(t) is None])
    bos_id = inner.token_to_id(bos) if bos is not None else None
    return Tokenizer(inner, base.kind, bos_id=bos_id, eos_ids=base.eos_ids, split_regex=base.split_regex())


@pytest.fixture(scope="module")
def qwen2_tokenizer() -> Tokenizer:
    return resolve_model(None).tokenizer


@pytest.fixture(scope="module")
def qwen3(qwen2_tokenizer: Tokenizer) -> Qwen3Format:
    fmt = chat_format_for("qwen3", _with_tokens(qwen2_tokenizer, ["<think>", "</think>"], special=False), None)
    assert isinstance(fmt, Qwen3Format)
    return fmt


@pytest.fixture(scope="module")
def llama3(qwen2_tokenizer: Tokenizer) -> Llama3Format:
    tok = _with_tokens(qwen2_tokenizer, LLAMA_SPECIALS, special=True, bos="<|begin_of_text|>")
    fmt = chat_format_for("llama", tok, LLAMA3_TEMPLATE)
    assert isinstance(fmt, Llama3Format)
    return fmt


_build = build_conversation


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=lambda c: "-".join(r for r, _ in c))
def test_qwen3_builder_equals_the_jinja_template(qwen3: Qwen3Format, conversation: list, thinking: bool) -> None:
    ids, messages, cue = _build(qwen3.builder(enable_thinking=thinking), conversation)
    text = render_chat_template(QWEN3_TEMPLATE, messages, add_generation_prompt=cue, enable_thinking=thinking)
    assert ids == qwen3.tokenizer.encode(text), qwen3.tokenizer.decode(ids)


def test_qwen3_cue_writes_an_empty_think_block_only_without_thinking(qwen3: Qwen3Format) -> None:
    tok = qwen3.tokenizer
    assert tok.decode(qwen3.builder().cue()) == "<|im_start|>assistant\n"
    assert tok.decode(qwen3.builder(enable_thinking=False).cue()) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.decode(qwen3.builder().user("hi")) == "<|im_start|>user\nhi<|im_end|>\n"  # no default system


def test_qwen3_history_turn_drops_its_reasoning(qwen3: Qwen3Format) -> None:
    assert qwen3.tokenizer.decode(qwen3.assistant(REASONED)) == "<|im_start|>assistant\nIt is 4.<|im_end|>\n"


def test_qwen3_seal_closes_a_generated_turn_like_the_template(qwen3: Qwen3Format) -> None:
    b = qwen3.builder()
    ids = b.user("2+2?") + b.cue() + qwen3.tokenizer.encode(REASONED) + b.seal()
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": REASONED}]
    assert ids == qwen3.tokenizer.encode(render_chat_template(QWEN3_TEMPLATE, messages))


def test_qwen3_markers_and_stop_tokens(qwen3: Qwen3Format) -> None:
    tok = qwen3.tokenizer
    assert qwen3.reasoning_markers == ("<think>", "</think>")
    assert qwen3.reasoning_marker_ids == (tok.token_to_id("<think>"), tok.token_to_id("</think>"))
    assert qwen3.stop_tokens == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    assert qwen3.template == QWEN3_TEMPLATE and qwen3.default_system is None


def test_qwen3_tools_equal_the_template(qwen3: Qwen3Format) -> None:
    tools = [{"type": "function", "function": {"name": "now", "description": "Time", "parameters": {"type": "object"}}}]
    b = qwen3.builder()
    ids = b.equip(tools) + b.user("time?") + b.answer("now", {"t": 1}) + b.cue()
    messages = [{"role": "user", "content": "time?"}, {"role": "tool", "content": '{"t": 1}'}]
    expected = render_chat_template(QWEN3_TEMPLATE, messages, tools=tools, add_generation_prompt=True)
    assert ids == qwen3.tokenizer.encode(expected)


def test_qwen3_needs_think_tokens(qwen2_tokenizer: Tokenizer) -> None:
    with pytest.raises(Unsupported, match="<think>"):
        Qwen3Format(qwen2_tokenizer, None)
    assert isinstance(chat_format_for("qwen3", qwen2_tokenizer, None), ChatMLFormat)


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=lambda c: "-".join(r for r, _ in c))
def test_llama3_builder_equals_the_jinja_template(llama3: Llama3Format, conversation: list) -> None:
    ids, messages, cue = _build(llama3.builder(), conversation)
    text = render_chat_template(LLAMA3_TEMPLATE, messages, add_generation_prompt=cue,
                                bos_token="<|begin_of_text|>", date_string=DEFAULT_DATE)
    assert ids == llama3.tokenizer.encode(text), llama3.tokenizer.decode(ids)


def test_llama3_writes_the_default_system_block_with_a_fixed_date(llama3: Llama3Format) -> None:
    tok = llama3.tokenizer
    assert tok.decode(llama3.builder().user(" hi ")) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    )
    dated = Llama3Format(tok, None, date_string="01 Jan 2025")
    assert "Today Date: 01 Jan 2025\n" in tok.decode(dated.builder().cue())


def test_llama3_seal_and_stop_tokens(llama3: Llama3Format) -> None:
    tok = llama3.tokenizer
    b = llama3.builder()
    ids = b.user("Hello") + b.cue() + tok.encode("Hi!") + b.seal() + b.user("Bye") + b.cue()
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"},
                {"role": "user", "content": "Bye"}]
    text = render_chat_template(LLAMA3_TEMPLATE, messages, add_generation_prompt=True,
                                bos_token="<|begin_of_text|>", date_string=DEFAULT_DATE)
    assert ids == tok.encode(text)
    assert llama3.stop_tokens == tuple(tok.token_to_id(t) for t in ("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"))
    assert llama3.reasoning_markers is None and llama3.reasoning_marker_ids is None


def test_llama3_agrees_with_the_template_driven_format(llama3: Llama3Format) -> None:
    generic = TemplateFormat(llama3.tokenizer, LLAMA3_TEMPLATE, llama3.stop_tokens,
                             bos_token="<|begin_of_text|>", date_string=DEFAULT_DATE)
    for conversation in CONVERSATIONS:
        a, b = llama3.builder(), generic.builder()
        for role, text in conversation:
            if role == "cue":
                assert a.cue() == b.cue()
            else:
                assert getattr(a, role)(text) == getattr(b, role)(text)


def test_llama3_template_without_header_tokens_is_unsupported(qwen2_tokenizer: Tokenizer) -> None:
    with pytest.raises(Unsupported, match="start_header_id"):
        Llama3Format(qwen2_tokenizer, None)
