"""A user streaming ``decode=True, tool_use=True`` never sees tool-call markup: a call arrives as
``ToolCallStart`` and ``ToolCall(name, arguments)``, the text around it as ``Text``, and
``Done`` carries exactly the streamed text (the reference's Text / ToolCall / Done events).

The dummy model is Qwen 2.5 (``<tool_call>`` ... ``</tool_call>``). Each test feeds the decoder
the reply in chunks, each chunk tokenized on its own, so a marker can arrive split across tokens
(``<t`` ``ool_c`` ``all>``) the way a sampler may write it.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from inferlet import Decoder, Model, chat, runtime
from inferlet._call_splitter import CallSplitter, Closed, Opened

CALL = '\n{"name": "pick", "arguments": {"speed": "fast"}}\n'
PICK = ["ToolCall", "pick", '{"speed": "fast"}']


def _plain(event) -> list:
    return [type(event).__name__, *(getattr(event, f) for f in ("text", "name", "arguments") if hasattr(event, f))]


def _decode(dummy, chunks: list[str], *, end: str = "stop") -> list[list]:
    """The events after each chunk, then those of the end of the reply (a stop token, or
    ``finish()`` as at ``max_tokens``); a chunk of several tokens may give a Text event per
    token, so each step's adjacent Text events are joined."""

    async def main(_):
        model = Model.load(runtime.models()[0])
        tok = model.tokenizer()
        dec = Decoder(model, tool_use=True)
        steps = [dec.feed(tok.encode(chunk)) for chunk in chunks]
        steps.append(dec.feed(chat.stop_tokens(model)[:1]) if end == "stop" else dec.finish())
        return [_joined([_plain(e) for e in step]) for step in steps]

    steps = dummy.value(main)
    events = _flat(steps)
    assert events[-1] == ["Done", "".join(e[1] for e in events if e[0] == "Text")]  # Done: all the text streamed
    return steps


def _joined(events: list[list]) -> list[list]:
    out: list[list] = []
    for e in events:
        if e[0] == "Text" and out and out[-1][0] == "Text":
            out[-1] = ["Text", out[-1][1] + e[1]]
        else:
            out.append(e)
    return out


def _flat(steps: list[list]) -> list[list]:
    return _joined([e for step in steps for e in step])


def test_a_marker_split_across_tokens_is_never_text(dummy):
    steps = _decode(dummy, ["Sure", ".", "<", "t", "ool", "_c", "all", ">", CALL, "</", "tool", "_call", ">"])
    assert _flat(steps) == [["Text", "Sure."], ["ToolCallStart"], PICK, ["Done", "Sure."]]
    assert steps[:7] == [[["Text", "Sure"]], [["Text", "."]], [], [], [], [], []]
    assert steps[7] == [["ToolCallStart"]]  # when ``<tool_call>`` completes, not before
    assert steps[12] == [PICK]


def test_text_that_may_open_a_marker_is_held_until_it_turns_out_not_to(dummy):
    steps = _decode(dummy, ["a ", "<", "tool", " b", " <tool_cal", "l", "ed>", "<"])
    assert steps[:3] == [[["Text", "a "]], [], []]  # ``<``, ``<tool``: maybe a marker
    assert steps[3] == [["Text", "<tool b"]]  # no longer: released whole, with what followed
    assert steps[4:6] == [[["Text", " "]], []]
    assert steps[6] == [["Text", "<tool_called>"]]
    assert steps[7] == []
    assert steps[8] == [["Text", "<"], ["Done", "a <tool b <tool_called><"]]  # the reply ended: no marker


def test_a_less_than_sign_held_at_max_tokens_is_released_before_done(dummy):
    steps = _decode(dummy, ["x ", "<"], end="finish")
    assert steps == [[["Text", "x "]], [], [["Text", "<"], ["Done", "x <"]]]


def test_text_before_and_after_a_call_streams_in_order_without_the_markup(dummy):
    steps = _decode(dummy, ["Let me check.", "\n<tool_call>", CALL, "</tool_call>", " It is", " fast."])
    assert _flat(steps) == [["Text", "Let me check."], ["ToolCallStart"], PICK, ["Text", " It is fast."],
                            ["Done", "Let me check. It is fast."]]


def test_several_calls_in_a_reply_leave_only_the_text_between_them(dummy):
    chunks = ["A", "<tool", "_call>", CALL, "</tool_call>\n<tool_call>", CALL, "</tool", "_call>B ", "<", "b"]
    assert _flat(_decode(dummy, chunks)) == [["Text", "A"], ["ToolCallStart"], PICK, ["ToolCallStart"], PICK,
                                             ["Text", "B <b"], ["Done", "AB <b"]]


def test_a_call_cut_off_by_max_tokens_is_not_text(dummy):
    steps = _decode(dummy, ["Sure.", "<tool_call>", '\n{"name": "pi'], end="finish")
    assert _flat(steps) == [["Text", "Sure."], ["ToolCallStart"], ["Done", "Sure."]]


def test_markers_a_tokenizer_marks_special_are_cut_out_too(dummy, observed):
    async def main(_):
        model = Model.load(runtime.models()[0])
        tok = model.tokenizer()
        markers = [tok.encode("<tool_call>")[0], tok.encode("</tool_call>")[0]]
        ids, texts = tok.special_tokens()
        special = (ids + markers, texts + [b"<tool_call>", b"</tool_call>"])
        observed.override(("model", "special_tokens"), lambda name: special)
        dec = Decoder(model, tool_use=True)
        reply = [*tok.encode("Sure."), markers[0], *tok.encode(CALL), markers[1], *tok.encode(" Done.")]
        events = dec.feed(reply) + dec.feed(chat.stop_tokens(model)[:1])
        return _joined([_plain(e) for e in events])

    assert dummy.value(main) == [["Text", "Sure."], ["ToolCallStart"], PICK, ["Text", " Done."],
                                 ["Done", "Sure. Done."]]


# The splitter itself: however the reply is cut into chunks, the same text and calls come out.

REPLY_PARTS = st.sampled_from(["Sure.", " ok", "<", "<t", "<tool", "/", ">", "\n", "tool_call", "<tool_call>",
                               "</tool_call>", '{"a": 1}', "é"])


def _split_whole(parts: list[str]) -> list:
    splitter = CallSplitter("<tool_call>", "</tool_call>")
    return _merged(splitter.feed("".join(parts)) + splitter.finish())


def _merged(pieces: list) -> list:
    """Adjacent text pieces joined: chunking may cut text anywhere, never move a boundary."""
    out: list = []
    for piece in pieces:
        if isinstance(piece, str) and out and isinstance(out[-1], str):
            out[-1] += piece
        else:
            out.append(piece)
    return out


@given(st.lists(REPLY_PARTS, max_size=14), st.data())
def test_the_splitter_gives_the_same_pieces_however_the_text_is_chunked(parts, data):
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    splitter = CallSplitter("<tool_call>", "</tool_call>")
    pieces = []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        pieces += splitter.feed(text[a:b])
    pieces += splitter.finish()
    assert _merged(pieces) == _split_whole(parts)
    assert not any("<tool_call>" in p for p in _merged(pieces) if isinstance(p, str))


def test_the_splitter_cuts_calls_out_and_keeps_the_text_around_them():
    splitter = CallSplitter("<tool_call>", "</tool_call>")
    assert splitter.feed("Hi <tool_call>{}</tool_call> and <tool_call>[1]</tool_call>\n<tool_call>2") == [
        "Hi ", Opened(), Closed("{}"), " and ", Opened(), Closed("[1]"), Opened()]
    assert splitter.inside and splitter.finish() == [] and not splitter.inside
