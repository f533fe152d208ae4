"""Windowed attention: a raw Forward loop where every row sees only the first ``sink`` tokens
and the last ``window`` tokens of the KV cache (the "attention sink" recipe of StreamingLLM).

Attention masks are BRLE: run lengths of alternating values, the first run False (hidden), so
``[0, 3, 5, 2]`` means 3 attended, 5 hidden, 2 attended. One mask per input token, each as long
as the KV cache will be after the pass.
"""

from inferlet import Context, Model, Sampler, chat, runtime


def window_mask(query: int, kv_len: int, sink: int, window: int) -> list[int]:
    """BRLE row for the token at position ``query``: attend to [0, sink) and the last
    ``window`` positions up to and including itself; hide everything after it (causal)."""
    visible = query + 1
    if visible <= sink + window:
        return [0, visible, kv_len - visible]
    return [0, sink, visible - sink - window, window, kv_len - visible]


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    sink, window = input["sink"], input["window"]
    stop = set(chat.stop_tokens(model))
    greedy = Sampler.argmax()

    pending = chat.user(model, input["prompt"]) + chat.cue(model)  # tokens for the next pass
    generated: list[int] = []
    with Context(model) as ctx:
        while len(generated) < input["max_tokens"]:
            fwd = ctx.forward().input(pending)
            start, kv_len = fwd.start_position(), ctx.seq_len + len(pending)
            fwd.attention_mask([window_mask(start + i, kv_len, sink, window) for i in range(len(pending))])
            h = fwd.sample(len(pending) - 1, greedy)
            tok = (await fwd.execute()).token(h)
            if tok in stop:
                break
            generated.append(tok)
            pending = [tok]

    return {"text": model.tokenizer().decode(generated), "tokens": generated}
