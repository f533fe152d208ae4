"""Model.load, runtime.models, vocab_size and every Tokenizer method; the chat helpers'
token lists; an unknown model is refused by name."""

from inferlet import Model, chat, runtime
from inferlet.host.errors import NotFound


async def main(input):
    names = runtime.models()
    model = Model.load(names[0])
    tk = model.tokenizer()
    text = "Hello, wörld! 123"
    ids = tk.encode(text)
    if tk.decode(ids) != text:
        raise AssertionError(f"decode(encode(text)) gave {tk.decode(ids)!r}")
    vocab_ids, vocab_bytes = tk.vocabs()
    if len(vocab_ids) != len(vocab_bytes) or not all(isinstance(b, bytes) for b in vocab_bytes[:50]):
        raise AssertionError("vocabs() must be parallel lists of ids and bytes")
    by_id = dict(zip(vocab_ids, vocab_bytes))
    if b"".join(by_id[t] for t in tk.encode("Hello")) != b"Hello":
        raise AssertionError("the vocabulary's bytes do not spell the encoded text")
    special_ids, special_bytes = tk.special_tokens()
    stops = chat.stop_tokens(model)
    if not set(stops) <= set(special_ids):
        raise AssertionError(f"stop tokens {stops} are not special tokens")
    try:
        Model.load("no-such-model")
        refused = None
    except NotFound as exc:
        refused = [type(exc).__name__, str(exc)]
    return {
        "models": names,
        "model_repr": repr(model),
        "same_model": Model.load(names[0]) == model and hash(Model.load(names[0])) == hash(model),
        "vocab_size": model.vocab_size,
        "encoded": ids,
        "vocab_len": len(vocab_ids),
        "vocab_sample": [[i, by_id[i].decode("latin-1")] for i in (0, 100, 1000, 151000)],
        "special": [[i, b.decode("latin-1")] for i, b in zip(special_ids[:6], special_bytes[:6])],
        "special_count": len(special_ids),
        "split_regex": tk.split_regex(),
        "chat": {
            "system": chat.system(model, "be brief"),
            "user": chat.user(model, "hi"),
            "assistant": chat.assistant(model, "hello"),
            "cue": chat.cue(model),
            "seal": chat.seal(model),
            "stop": stops,
        },
        "unknown_model": refused,
    }
