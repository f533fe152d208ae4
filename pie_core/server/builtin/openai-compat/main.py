"""The built-in inferlet behind the server's OpenAI-compatible endpoints.

It streams each piece of reply text with ``session.send`` (the server turns those into SSE
chunks or joins them) and returns the finish reason and token counts, or ``{"error", "param", "code"}`` when the
prompt and reply cannot fit the model's context (the server answers that with a 400). Stop strings are held
back until they can no longer match, so no part of a stop string is ever sent.
"""

import json
from typing import Any

from inferlet import AnyJson, Context, JsonSchema, Model, Sampler, chat, runtime, session

ROLES = ("system", "user", "assistant")


async def main(input: dict) -> dict:
    model = Model.load(input.get("model") or runtime.models()[0])
    stops = [s for s in json.loads(input.get("stop") or "[]") if s]
    scanner = _StopScanner(stops)
    constraint: Any = None
    if input.get("schema"):
        constraint = JsonSchema(json.loads(input["schema"]))
    elif input["json_object"]:
        constraint = AnyJson()
    with Context(model) as ctx:
        if input["mode"] == "chat":
            for msg in json.loads(input.get("messages") or "[]"):
                if msg.get("role") not in ROLES or not isinstance(msg.get("content"), str):
                    raise ValueError(f"each message needs a role in {ROLES} and string content, got {msg!r}")
                getattr(ctx, msg["role"])(msg["content"])
            options: dict[str, Any] = {}
        else:
            ctx.fill(input.get("prompt") or "")
            options = {"auto_flush": False, "stop": chat.stop_tokens(model)}
        prompt_tokens = ctx.seq_len + len(ctx.buffer())
        limit = input.get("max_context") or 0
        if limit and prompt_tokens + input["max_tokens"] > limit:
            param = "messages" if input["mode"] == "chat" else "prompt"
            return {"error": f"this model's context holds {limit} tokens, but the request needs {prompt_tokens + input['max_tokens']} "
                             f"({prompt_tokens} in the {param}, {input['max_tokens']} for the reply); shorten the {param} or lower max_tokens",
                    "param": param, "code": "context_length_exceeded"}
        g = ctx.generate(_sampler(input), max_tokens=input["max_tokens"], constrain=constraint, **options)
        dec = chat.Decoder(model)
        finish = "length"
        async for step in g:
            out = await step.execute()
            event = dec.feed(out.tokens)
            if isinstance(event, chat.Event.Delta):
                text, stopped = scanner.feed(event.text)
                if text:
                    session.send(text)
                if stopped:
                    finish = "stop"
                    break
            elif isinstance(event, chat.Event.Done):
                finish = "stop"
        if finish != "stop" and g.is_done and g.tokens_generated < input["max_tokens"]:
            finish = "stop"
        rest = scanner.flush()
        if rest:
            session.send(rest)
        return {"finish_reason": finish, "prompt_tokens": prompt_tokens, "completion_tokens": g.tokens_generated}


def _sampler(input: dict) -> Sampler:
    t, p = input["temperature"], input["top_p"]
    if t <= 0:
        return Sampler.argmax()
    if p < 1.0:
        return Sampler.top_p(t, p, seed=input["seed"])
    return Sampler.multinomial(t, seed=input["seed"])


class _StopScanner:
    """Cuts the text at the first stop string; holds back a tail that may start one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        self.held += text
        hits = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.held, self.stopped = self.held[: min(hits)], "", True
            return out, True
        keep = max((k for s in self.stops for k in range(1, len(s)) if self.held.endswith(s[:k])), default=0)
        cut = len(self.held) - keep
        out, self.held = self.held[:cut], self.held[cut:]
        return out, False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
