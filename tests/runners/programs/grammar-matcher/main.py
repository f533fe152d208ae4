"""Grammars (from_json_schema, json, from_regex, from_ebnf) and a Matcher walked by hand:
accept_tokens, try_accept, rollback, fork, reset, the BRLE and packed masks, is_completed and
is_terminated; GrammarConstraint.step; malformed grammars and refused tokens raise InvalidInput."""

from inferlet import Grammar, GrammarConstraint, Matcher, Model, chat, runtime


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def allowed(runs):
    """How many ids a BRLE mask (first run disallowed) allows."""
    return sum(runs[1::2])


def refused(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]
    return None


async def main(input):
    model = Model.load(runtime.models()[0])
    tk = model.tokenizer()
    vocab = model.vocab_size
    stop = chat.stop_tokens(model)[0]
    out = {}
    grammars = {
        "schema": Grammar.from_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}),
        "schema_text": Grammar.from_json_schema(schema='{"type": "string"}'),
        "json": Grammar.json(),
        "json_ws": Grammar.json(whitespace=True),
        "regex": Grammar.from_regex(pattern="(yes|no)"),
        "lark": Grammar.from_ebnf('start: "a"+ "b"'),
        "gbnf": Grammar.from_ebnf(ebnf='root ::= "x" | "y"'),
    }
    out["kinds"] = {k: [g.kind, g.text] for k, g in grammars.items()}
    check(Grammar.from_regex("(yes|no)") == grammars["regex"] and hash(Grammar.from_regex("(yes|no)")) == hash(grammars["regex"]),
          "equal sources are equal grammars")
    out["repr"] = repr(grammars["regex"])

    m = Matcher(grammars["regex"], tk)
    await m.ready()
    runs = m.next_token_logit_mask()
    packed = m.packed_mask()
    check(sum(runs) == vocab and len(packed) == (vocab + 7) // 8, "masks cover the vocabulary")
    check(int.from_bytes(packed, "little").bit_count() == allowed(runs), "the BRLE and packed masks agree")
    out["start"] = [allowed(runs), m.is_completed, m.is_terminated]
    yes = tk.encode("yes")
    no = tk.encode("no")
    check(not m.try_accept(tk.encode("maybe")[0]), "try_accept refuses a token the grammar forbids")
    out["refused_accept"] = refused(lambda: m.accept_tokens(tk.encode("maybe")))
    m.accept_tokens(yes)
    out["after_yes"] = [m.is_completed, m.is_terminated, allowed(m.next_token_logit_mask())]
    check(m.try_accept(stop) and m.is_terminated, "the stop token terminates a complete sentence")
    out["terminated_mask"] = refused(m.next_token_logit_mask)
    m.rollback(1)
    check(not m.is_terminated and m.is_completed, "rollback undoes the stop token")
    copy = m.fork()
    m.reset()
    check(not m.is_completed and copy.is_completed, "reset leaves the fork alone")
    check(m.try_accept(no[0]), "after reset the grammar starts over")
    out["fork"] = [repr(copy).startswith("Matcher("), copy.grammar == grammars["regex"]]

    lark = Matcher(grammars["lark"], model)
    lark.accept_tokens(ids=tk.encode("aaa"))
    out["lark"] = [lark.is_completed, allowed(lark.next_token_logit_mask())]
    lark.accept_tokens(tk.encode("b"))
    out["lark_done"] = lark.is_completed

    schema = Matcher(grammars["schema"], tk)
    schema.accept_tokens(tk.encode('{"a": 12'))
    out["schema"] = [schema.is_completed, allowed(schema.next_token_logit_mask())]

    gc = GrammarConstraint.from_regex("(yes|no)", model)
    first = gc.step([])
    second = gc.step(yes)
    out["constraint_step"] = [allowed(first), allowed(second), gc.model_name, repr(gc).startswith("GrammarConstraint(")]
    check(GrammarConstraint(gc.matcher).matcher is gc.matcher, "a GrammarConstraint wraps a Matcher")

    out["malformed"] = [
        refused(lambda: Grammar.from_json_schema("{")),
        refused(lambda: Grammar.from_json_schema({"type": "no-such-type"})),
        refused(lambda: Grammar.from_regex("a(?<=b)")),
        refused(lambda: Grammar.from_ebnf("start: ")),
        refused(lambda: Grammar.from_ebnf('root ::= undefined')),
        refused(lambda: Matcher("(yes|no)", tk)),
        refused(lambda: Matcher(grammars["regex"], "tokenizer")),
        refused(lambda: GrammarConstraint("matcher")),
        refused(lambda: Grammar("source")),
        refused(lambda: Matcher(grammars["regex"], tk, compile_timeout=-1.5)),
    ]
    return out
