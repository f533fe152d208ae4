"""Reference section "Decoders": ``chat.Decoder`` event by event, and the ``chat`` helpers
(reasoning.Decoder has test_reasoning_decoder.py; the unified decoder test_decode_events.py)."""

from __future__ import annotations

from inferlet import Context, Model, chat, runtime
from inferlet.chat import Event


def _run(dummy, check):
    async def main(_):
        return check(Model.load(runtime.models()[0]))

    return dummy.value(main)


def _plain(event) -> list:
    return [type(event).__name__, *[getattr(event, f) for f in ("text", "token") if hasattr(event, f)]]


def test_delta_streams_text_and_done_carries_the_whole_reply(dummy):
    def check(model: Model):
        dec = chat.Decoder(model)
        ids = model.tokenizer().encode("Hello, world! 中文")
        return [_plain(dec.feed([t])) for t in ids] + [_plain(dec.feed(chat.stop_tokens(model)[:1]))]

    events = _run(dummy, check)
    assert events[-1] == ["Done", "Hello, world! 中文"]
    assert "".join(e[1] for e in events[:-1] if e[0] == "Delta") == "Hello, world! 中文"
    assert {e[0] for e in events[:-1]} <= {"Delta", "Idle"}


def test_idle_while_a_character_is_incomplete(dummy):
    def check(model: Model):
        tk = model.tokenizer()
        char = next(c for c in "🤗𓀀ꙮ𝔘" if len(tk.encode(c)) > 1)
        dec = chat.Decoder(model)
        return char, [_plain(dec.feed([t])) for t in tk.encode(char)]

    char, events = _run(dummy, check)
    assert all(e == ["Idle"] for e in events[:-1]) and events[-1] == ["Delta", char]


def test_one_batch_gives_one_event_and_done_includes_text_of_the_same_batch(dummy):
    def check(model: Model):
        dec = chat.Decoder(model)
        tk = model.tokenizer()
        first = _plain(dec.feed(tk.encode("one two")))
        last = _plain(dec.feed(tk.encode(" three") + chat.stop_tokens(model)[:1]))
        return first, last

    assert _run(dummy, check) == (["Delta", "one two"], ["Done", "one two three"])


def test_interrupt_reports_a_control_token_that_is_not_a_stop(dummy):
    def check(model: Model):
        dec = chat.Decoder(model)
        control = model.tokenizer().encode("<|im_start|>")[0]
        event = dec.feed(model.tokenizer().encode("hi") + [control])
        return _plain(event), control, dec.text()

    event, control, text = _run(dummy, check)
    assert event == ["Interrupt", control] and text == "hi"


def test_reset_forgets_the_reply_so_far(dummy):
    def check(model: Model):
        dec = chat.Decoder(model)
        tk = model.tokenizer()
        dec.feed(tk.encode("forgotten"))
        dec.reset()
        dec.feed(tk.encode("kept"))
        return _plain(dec.feed(chat.stop_tokens(model)[:1]))

    assert _run(dummy, check) == ["Done", "kept"]


def test_helpers_return_token_ids_for_append(dummy):
    async def main(_):
        model = Model.load(runtime.models()[0])
        tk = model.tokenizer()
        pieces = {
            "system": chat.system(model, "S"), "user": chat.user(model, "U"),
            "assistant": chat.assistant(model, "A"), "cue": chat.cue(model), "seal": chat.seal(model),
        }
        with Context(model) as ctx:
            ctx.append(pieces["system"]).append(pieces["user"]).append(pieces["cue"])
            via_append = ctx.buffer()
        with Context(model) as ctx:
            via_methods = ctx.system("S").user("U").cue().buffer()
        decoded = {k: tk.decode(v) for k, v in pieces.items()}
        return decoded, via_append == via_methods, [tk.decode([t]) for t in chat.stop_tokens(model)]

    decoded, same, stops = dummy.value(main)
    assert decoded == {
        "system": "<|im_start|>system\nS<|im_end|>\n",
        "user": "<|im_start|>user\nU<|im_end|>\n",
        "assistant": "<|im_start|>assistant\nA<|im_end|>\n",
        "cue": "<|im_start|>assistant\n",
        "seal": "<|im_end|>\n",
    }
    assert same and "<|im_end|>" in stops
