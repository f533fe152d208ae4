"""Chat formats: per-family incremental token builders checked against the Jinja templates.

Use :func:`chat_format_for` to get the format of a model, then ``fmt.builder()`` per context.
"""

from __future__ import annotations

from pie_core.errors import Unsupported
from pie_core.models.chat_formats.base import ChatBuilder, ChatFormat
from pie_core.models.chat_formats.chatml import ChatMLFormat
from pie_core.models.chat_formats.gemma import GEMMA3_TEMPLATE, GemmaFormat
from pie_core.models.chat_formats.llama3 import LLAMA3_TEMPLATE, Llama3Format
from pie_core.models.chat_formats.qwen3 import QWEN3_TEMPLATE, Qwen3Format
from pie_core.models.chat_formats.template import render_chat_template
from pie_core.models.chat_formats.template_format import TemplateFormat
from pie_core.models.tokenizer import Tokenizer

__all__ = [
    "ChatBuilder",
    "ChatFormat",
    "ChatMLFormat",
    "GemmaFormat",
    "Llama3Format",
    "Qwen3Format",
    "TemplateFormat",
    "GEMMA3_TEMPLATE",
    "LLAMA3_TEMPLATE",
    "QWEN3_TEMPLATE",
    "chat_format_for",
    "render_chat_template",
]


def chat_format_for(arch: str, tokenizer: Tokenizer, template: str | None) -> ChatFormat:
    """Pick the chat format of a model.

    Qwen 2 with a ChatML template (or none) gets :class:`ChatMLFormat`; Qwen 3 with ChatML and
    think tokens :class:`Qwen3Format`; Llama with Llama 3 header tokens (and a template that
    uses them, or none) :class:`Llama3Format`; Gemma 3 :class:`GemmaFormat` (each with the
    family's published template when the checkpoint ships none);
    any other model with a template :class:`TemplateFormat`; a model with neither a template
    nor ChatML tokens cannot chat.

    Args:
        arch: Architecture name from the spec.
        tokenizer: The model's tokenizer.
        template: The checkpoint's Jinja chat template, if any.

    Raises:
        Unsupported: No way to format a chat for this model.
    """
    chatml = tokenizer.token_to_id("<|im_start|>") is not None
    if arch == "gemma3" and tokenizer.token_to_id("<start_of_turn>") is not None:
        return GemmaFormat(tokenizer, template)
    think = tokenizer.token_to_id("<think>") is not None and tokenizer.token_to_id("</think>") is not None
    if arch == "qwen3" and chatml and think and (template is None or "<|im_start|>" in template):
        return Qwen3Format(tokenizer, template)
    header = tokenizer.token_to_id("<|start_header_id|>") is not None
    if arch == "llama" and header and (template is None or "<|start_header_id|>" in template):
        return Llama3Format(tokenizer, template)
    if arch == "qwen2" and chatml and (template is None or "<|im_start|>" in template):
        return ChatMLFormat(tokenizer, template)
    if template is not None:
        stops = tuple(dict.fromkeys(tokenizer.eos_ids))
        return TemplateFormat(tokenizer, template, stops)
    if chatml:
        return ChatMLFormat(tokenizer, None)
    raise Unsupported(f"no chat template and no known chat format for this {arch} model")
