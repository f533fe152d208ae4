"""reasoning.Decoder streams the text between a model's reasoning markers, UTF-8 safe."""

from __future__ import annotations

from typing import Callable

from inferlet import reasoning, runtime
from inferlet.model import Model
from inferlet.reasoning import Event

# The default model (Qwen 2.5) has no <think> token; its single-token <tool_call> and
# </tool_call> stand in as markers for the state machine.
START, END = "<tool_call>", "</tool_call>"


def _ids(model: Model, text: str) -> list[int]:
    return model.tokenizer().encode(text)


def _inside_an_inferlet(dummy, check: Callable[[Model], None]) -> None:
    """Run ``check`` in an inferlet (host calls need one); its assertion errors fail the test."""

    async def main(_):
        check(Model.load(runtime.models()[0]))
        return "ok"

    assert dummy.value(main) == "ok"


def _marked(model: Model) -> reasoning.Decoder:
    return reasoning.Decoder(model, markers=(_ids(model, START)[0], _ids(model, END)[0]))


def test_model_without_reasoning_markers_stays_idle(dummy):
    def check(model: Model) -> None:
        decoder = reasoning.Decoder(model)
        assert decoder.markers is None
        events = [decoder.feed([t]) for t in _ids(model, "<think>\nhmm\n</think>\n\nhello")]
        assert all(e == Event.Idle() for e in events), events

    _inside_an_inferlet(dummy, check)


def test_streams_start_deltas_and_end_with_the_full_reasoning(dummy):
    def check(model: Model) -> None:
        decoder = _marked(model)
        events = [decoder.feed([t]) for t in _ids(model, f"Sure.{START}\nweigh 中文 🤗 options\n{END}\n\nAnswer")]
        assert events[0] == Event.Idle()
        starts = [i for i, e in enumerate(events) if e == Event.Start()]
        ends = [i for i, e in enumerate(events) if isinstance(e, Event.End)]
        assert len(starts) == 1 and len(ends) == 1 and starts[0] < ends[0], events
        deltas = "".join(e.text for e in events[starts[0]:ends[0]] if isinstance(e, Event.Delta))
        assert deltas == events[ends[0]].text == "\nweigh 中文 🤗 options\n"
        assert all(e == Event.Idle() for e in events[ends[0] + 1:]) and not decoder.inside

    _inside_an_inferlet(dummy, check)


def test_byte_split_characters_are_held_until_complete(dummy):
    def check(model: Model) -> None:
        decoder = _marked(model)
        start, end = decoder.markers
        char = next(c for c in "🤗𓀀ꙮ𝔘" if len(_ids(model, c)) > 1)  # one split into byte-level tokens
        body = _ids(model, char)
        events = [decoder.feed([start])] + [decoder.feed([t]) for t in body] + [decoder.feed([end])]
        assert events[0] == Event.Start()
        assert all(e == Event.Idle() for e in events[1:-2]), events
        assert events[-2] == Event.Delta(char) and events[-1] == Event.End(char)

    _inside_an_inferlet(dummy, check)


def test_one_batch_reports_the_most_final_boundary(dummy):
    def check(model: Model) -> None:
        decoder = _marked(model)
        start, end = decoder.markers
        assert decoder.feed([start, *_ids(model, "abc")]) == Event.Start()
        assert decoder.feed(_ids(model, "def")) == Event.Delta("abcdef")
        assert decoder.feed([start, *_ids(model, "x"), end, *_ids(model, "answer")]) == Event.End("abcdefx")
        assert decoder.feed([start, *_ids(model, "y"), end]) == Event.End("y")  # a second block

    _inside_an_inferlet(dummy, check)


def test_reset_forgets_partial_reasoning(dummy):
    def check(model: Model) -> None:
        decoder = _marked(model)
        decoder.feed([decoder.markers[0], *_ids(model, "half")])
        assert decoder.inside and decoder.text() == "half"
        decoder.reset()
        assert not decoder.inside and decoder.text() == ""
        assert decoder.feed(_ids(model, "z")) == Event.Idle()

    _inside_an_inferlet(dummy, check)
