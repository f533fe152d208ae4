"""The built-in inferlet behind the server's OpenAI-compatible endpoints.

Modes: ``chat`` and ``completion`` generate ``n`` choices (forks of one prefilled prompt,
decoded together); ``embed`` returns one embedding per input.

Every message it sends (``session.send``) is one JSON object, read by ``pie_core/server/openai.py``:

- ``{"i": choice, "n": tokens, "text": str, "lp": [[id, logprob, [[id, logprob], ...]], ...]}``
  after each step (``lp`` only with logprobs: the step's released tokens and their top
  alternatives);
- ``{"i": choice, "call": [name, json_args]}`` when a tool call completes;
- ``{"i": input, "e": [floats], "t": tokens}`` per embedded input.

It returns ``{"prompt_tokens", "choices": [{"finish_reason", "completion_tokens"}]}``, or
``{"error", "param", "code"}`` for a request the model cannot serve (the server answers 400).
Stop strings are held back until they can no longer match, so no part of one is ever sent;
logprob entries are held back with the text of their tokens.
"""

import asyncio
import json
import math
import struct
from typing import Any

from inferlet import (AnyJson, Context, Distribution, Embedding, GrammarConstraint, JsonSchema, Logits, Model,
                      Sampler, chat, runtime, session, tools)

ROLES = ("system", "user", "assistant")
FLOOR = -9999.0  # OpenAI's logprob for "effectively impossible"


async def main(input: dict) -> Any:
    model = Model.load(input.get("model") or runtime.models()[0])
    if input["mode"] == "embed":
        return await _embed(model, input)
    with Context(model) as ctx:
        n, limit = input["n"], input.get("max_context") or 0
        refused, last = _fill(ctx, model, input, keep_last=n > 1)
        if refused:
            return refused
        prompt_tokens = ctx.seq_len + len(ctx.buffer()) + len(last)
        if limit and prompt_tokens + input["max_tokens"] > limit:
            return _too_long(input, limit, prompt_tokens, input["max_tokens"], "")
        pool = input.get("pool_tokens") or 0
        if pool and n > 1 and prompt_tokens + n * input["max_tokens"] > pool:
            return _too_long(input, pool, prompt_tokens, n * input["max_tokens"], f" of {n} choices")
        if n == 1:
            choices = [await _choice(0, ctx, model, input)]
        else:
            await ctx.flush()  # the prompt runs once; the forks share its pages
            ctx.append(last)  # a completion's last prompt token: each fork's first step runs it
            choices = await asyncio.gather(*(_choice(i, ctx.fork(), model, input) for i in range(n)))
        return {"prompt_tokens": prompt_tokens, "choices": list(choices)}


def _fill(ctx: Context, model: Model, input: dict, keep_last: bool) -> tuple[dict | None, list[int]]:
    """Put the prompt in the context's buffer. Returns an error dict when the model cannot take
    it, and (completion mode with ``keep_last``) the prompt's last token, left out of the buffer."""
    if input["mode"] != "chat":
        tokens = model.tokenizer().encode(input.get("prompt") or "")
        last = tokens[-1:] if keep_last else []
        ctx.append(tokens[: len(tokens) - len(last)])
        return None, last
    tool_list = json.loads(input.get("tools") or "[]")
    if tool_list:
        try:
            ctx.equip_tools(tool_list)
        except Exception as exc:  # Unsupported (no tool support in the template) or a malformed schema
            return {"error": f"model {model.name!r} cannot take tools: {exc}", "param": "tools",
                    "code": "unsupported_parameter"}, []
    for msg in json.loads(input.get("messages") or "[]"):
        if msg.get("role") == "tool":
            ctx.answer_tool(msg["name"], msg["content"])
        elif msg.get("role") in ROLES and isinstance(msg.get("content"), str):
            getattr(ctx, msg["role"])(msg["content"])
        else:
            raise ValueError(f"each message needs a role in {ROLES + ('tool',)} and string content, got {msg!r:.200}")
    return None, []


def _too_long(input: dict, limit: int, prompt: int, reply: int, what: str) -> dict:
    param = "messages" if input["mode"] == "chat" else "prompt"
    return {"error": f"this model's context holds {limit} tokens, but the request needs {prompt + reply} "
                     f"({prompt} in the {param}, {reply} for the reply{what}); shorten the {param} or lower max_tokens"
                     + (" or n" if what else ""),
            "param": param, "code": "context_length_exceeded"}


async def _choice(i: int, ctx: Context, model: Model, input: dict) -> dict:
    """Generate choice ``i`` on ``ctx`` (released at the end), sending its text as it comes."""
    with ctx:
        options: dict[str, Any] = {}
        if input["mode"] == "completion":
            options = {"auto_flush": False, "stop": chat.stop_tokens(model)}
        g = ctx.generate(_sampler(input, i), max_tokens=input["max_tokens"], constrain=_constraint(model, input), **options)
        probes = None
        if input["logprobs"]:
            probes = (g.probe_each_step(-1, Distribution(1.0, max(1, input["top_logprobs"]))),
                      g.probe_each_step(-1, Logits()))
        marker = input.get("call_begin") if input.get("parse_calls") else None
        out = _Reply(i, json.loads(input.get("stop") or "[]"), marker)
        text_dec = chat.Decoder(model)
        call_dec = tools.Decoder(model) if input.get("parse_calls") else None
        finish = "length"
        async for step in g:
            result = await step.execute()
            toks = result.tokens
            entries = _logprobs(result, toks, probes, input["top_logprobs"]) if probes else []
            event = text_dec.feed(toks)
            text = event.text if isinstance(event, chat.Event.Delta) else ""
            if isinstance(event, chat.Event.Done):
                finish = "stop"
            stopped = out.feed(text, entries, len(toks))  # first: it sees a call's opening text
            if call_dec is not None:
                out.watch_calls(call_dec, toks)
            if stopped:
                finish = "stop"
                break
        if finish != "stop" and g.is_done and g.tokens_generated < input["max_tokens"]:
            finish = "stop"  # a stop token of the completion mode, or the constraint's end
        out.flush()
        if out.calls:
            finish = "tool_calls"
        return {"finish_reason": finish, "completion_tokens": g.tokens_generated}


def _sampler(input: dict, i: int) -> Sampler:
    t, p, seed = input["temperature"], input["top_p"], input["seed"]
    seed = (seed + i) & 0x7FFFFFFF if seed else 0  # each choice its own draws, reproducible with a seed
    if t <= 0:
        return Sampler.argmax()
    if p < 1.0:
        return Sampler.top_p(t, p, seed=seed)
    return Sampler.multinomial(t, seed=seed)


def _constraint(model: Model, input: dict) -> Any:
    """A fresh constraint for one generator: the JSON schema, any JSON, or the tool-call grammar."""
    if input.get("schema"):
        return JsonSchema(json.loads(input["schema"]))
    if input["json_object"]:
        return AnyJson()
    if input.get("parse_calls"):
        matcher = tools.native_matcher(model, json.loads(input["tools"]), choice=input["tool_choice"])
        return None if matcher is None else GrammarConstraint(matcher)
    return None


def _logprobs(result: Any, toks: list[int], probes: tuple[Any, Any], top: int) -> list[list[Any]]:
    """``[id, logprob, [[id, logprob], ...top]]`` per token: raw model log-probabilities (temperature
    1, before top_p and any grammar). log p(t) = logit(t) - logZ, and logZ = logit(best) - log p(best)."""
    ids, probs = result.distribution(probes[0])
    logits = result.logits(probes[1])
    if not ids or not logits or probs[0] <= 0:
        return [[t, FLOOR, []] for t in toks]

    def logit(t: int) -> float:
        return struct.unpack_from("=f", logits, 4 * t)[0]

    log_z = logit(ids[0]) - math.log(probs[0])

    def lp(t: int) -> float:
        value = logit(t) - log_z
        return value if math.isfinite(value) else FLOOR

    alternatives = [[t, lp(t)] for t in ids[:top]]
    return [[t, lp(t), alternatives] for t in toks]


class _Reply:
    """One choice's outgoing text: cut at stop strings, tool-call text kept out of it, logprob
    entries released with the text of their tokens."""

    def __init__(self, index: int, stops: list[str], marker: str | None) -> None:
        self.index = index
        # a call's opening text ends the content like a stop string; "" (a bare JSON call) is
        # decided by the reply's first visible character
        self.marker = marker
        self.scanner = _StopScanner([s for s in stops if s] + ([marker] if marker else []))
        self.undecided = marker == ""
        self.lead: list[tuple[str, list[list[Any]], int]] = []
        self.pending: list[tuple[int, int, list[Any]]] = []  # (start, end) of each token's text, its entry
        self.seen = 0  # characters fed to the scanner
        self.sent = 0  # characters it released
        self.watching = True  # tool calls are parsed until one fails to parse
        self.calling = False  # a tool call started: text from here on is the call's
        self.held: list[str] = []  # text of calls that started (sent as content if none completes)
        self.calls = 0

    def watch_calls(self, dec: Any, toks: list[int]) -> None:
        if not self.watching:
            return
        try:
            event = dec.feed(toks)
            while not isinstance(event, tools.Event.Idle):
                if isinstance(event, tools.Event.Call):
                    session.send(json.dumps({"i": self.index, "call": [event.name, event.args]}))
                    self.calls += 1
                self.calling = True
                event = dec.feed([])
        except Exception:  # InvalidInput: a call block that does not parse stays text
            self.watching = False
            self.calling = self.calling or dec.inside

    def feed(self, text: str, entries: list[list[Any]], n: int) -> bool:
        """Take one step's text and logprob entries; send what is released. True at a stop string."""
        if self.calling:
            self.held.append(text)
            self._send("", [], n)
            return False
        if self.undecided:  # hold the reply until its first visible character tells text from a call
            self.lead.append((text, entries, n))
            lead = "".join(t for t, _, _ in self.lead).lstrip()
            if not lead:
                self._send("", [], n)
                return False
            self.undecided = False
            if lead.startswith("{"):
                self.calling = True
                self.held.append("".join(t for t, _, _ in self.lead))
                self._send("", [], n)
                return False
            text, entries = "".join(t for t, _, _ in self.lead), [e for _, es, _ in self.lead for e in es]
        start = self.seen
        self.seen += len(text)
        self.pending.extend((start, self.seen, e) for e in entries)
        released, hit, rest = self.scanner.feed(text)
        stopped = hit is not None
        self.sent += len(released)
        # at a stop string, a token whose text starts before the cut goes out with the text
        ready = [e for s, end, e in self.pending if end <= self.sent or (stopped and s < self.sent)]
        self.pending = [] if stopped else [p for p in self.pending if p[1] > self.sent]
        self._send(released, ready, n)
        if stopped and hit == self.marker:  # not a stop: a tool call begins
            self.calling = True
            self.held.append(rest)
            return False
        return stopped

    def flush(self) -> None:
        rest = "".join(t for t, _, _ in self.lead) if self.undecided else ""
        rest += self.scanner.flush()
        if not self.calls:
            rest += "".join(self.held)  # a call that never completed is what the model wrote
        entries = [e for _, _, e in self.pending] + ([e for _, es, _ in self.lead for e in es] if self.undecided else [])
        self.pending = []
        if rest or entries:
            self._send(rest, entries, 0)

    def _send(self, text: str, entries: list[list[Any]], n: int) -> None:
        msg: dict[str, Any] = {"i": self.index, "n": n, "text": text}
        if entries:
            msg["lp"] = entries
        session.send(json.dumps(msg))


class _StopScanner:
    """Cuts the text at the first stop string; holds back a tail that may start one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""

    def feed(self, text: str) -> tuple[str, str | None, str]:
        """The text released, the stop string hit (None: none) and the text from it on."""
        self.held += text
        hits = [(i, s) for i, s in ((self.held.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            at, stop = min(hits, key=lambda h: h[0])
            out, rest, self.held = self.held[:at], self.held[at:], ""
            return out, stop, rest
        keep = max((k for s in self.stops for k in range(1, len(s)) if self.held.endswith(s[:k])), default=0)
        cut = len(self.held) - keep
        out, self.held = self.held[:cut], self.held[cut:]
        return out, None, ""

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


async def _embed(model: Model, input: dict) -> dict:
    """Last-token embeddings of each input (texts, or token lists), a few at a time."""
    inputs = json.loads(input["inputs"])
    limit = input.get("max_context") or 0
    total = 0
    for start in range(0, len(inputs), 8):
        batch = inputs[start : start + 8]
        tokens = [item if isinstance(item, list) else model.tokenizer().encode(item) for item in batch]
        for k, toks in enumerate(tokens):
            if not toks:
                return {"error": f"input[{start + k}] is empty; embed at least one token", "param": "input", "code": None}
            if limit and len(toks) > limit:
                return {"error": f"input[{start + k}] has {len(toks)} tokens; this model's context holds {limit}: shorten it",
                        "param": "input", "code": "context_length_exceeded"}
        vectors = await asyncio.gather(*(_last_hidden(model, toks) for toks in tokens))
        for k, vec in enumerate(vectors):
            session.send(json.dumps({"i": start + k, "e": vec, "t": len(tokens[k])}))
            total += len(tokens[k])
    return {"prompt_tokens": total}


async def _last_hidden(model: Model, tokens: list[int]) -> list[float]:
    with Context(model) as ctx:
        ctx.append(tokens)
        fwd = ctx.forward(flush=True)
        h = fwd.probe(len(tokens) - 1, Embedding())
        vec = (await fwd.execute()).embedding(h) or []
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]
