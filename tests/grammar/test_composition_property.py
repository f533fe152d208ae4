"""Property: constraints ANDed together never let through a token that either of them forbids;
when together they allow nothing, the step fails with InvalidInput instead of sampling."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferlet import Context, Grammar, Matcher, Model, Regex, Sampler, runtime
from pie_core import brle

PATTERNS = [r"[0-9]{1,8}", r"[a-z ]{1,12}", r"(true|false|null)", r"[A-Za-z0-9_]{2,10}", r"-?[0-9]+(\.[0-9]+)?"]


class RandomMask:
    """A custom Constraint allowing a fresh random subset of the vocabulary each step."""

    def __init__(self, vocab: int, seed: int, density: float) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab, self.density = vocab, density
        self.masks: list[np.ndarray] = []
        self.steps: list[list[int]] = []

    def step(self, accepted: list[int]) -> list[int]:
        self.steps.append(list(accepted))
        mask = self.rng.random(self.vocab) < self.density
        self.masks.append(mask)
        return brle.encode(mask)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pattern=st.sampled_from(PATTERNS),
    seed=st.integers(0, 2**32 - 1),
    density=st.floats(0.02, 0.98),
    sampler_seed=st.integers(1, 10_000),
    greedy=st.booleans(),
)
def test_anded_constraints_never_produce_a_token_either_forbids(dummy, pattern, seed, density, sampler_seed, greedy):
    out: dict = {}

    async def main(_):
        model = Model.load(runtime.models()[0])
        custom = RandomMask(model.vocab_size, seed, density)
        sampler = Sampler.argmax() if greedy else Sampler.top_p(1.0, 1.0, seed=sampler_seed)
        error = None
        with Context(model) as ctx:
            ctx.user("go")
            g = ctx.generate(sampler, max_tokens=8, stop=[], constrain=[Regex(pattern), custom])
            try:
                await g.collect_tokens()
            except Exception as e:  # noqa: BLE001 - the property says which error is allowed
                error = e
            tokens = list(g._tokens)
        # replay the grammar side on its own matcher, step by step
        replay = Matcher(Grammar.from_regex(pattern), model)
        grammar_masks = []
        for tok in tokens:
            grammar_masks.append(brle.decode(replay.next_token_logit_mask(), model.vocab_size))
            replay.accept_tokens([tok])
        last = None if replay.is_terminated else brle.decode(replay.next_token_logit_mask(), model.vocab_size)
        out.update(tokens=tokens, custom=custom, grammar_masks=grammar_masks, last=last, error=error)

    dummy.value(main)  # objects are not JSON: they come back through ``out``
    tokens, custom, grammar_masks = out["tokens"], out["custom"], out["grammar_masks"]
    last, error = out["last"], out["error"]
    for i, tok in enumerate(tokens):
        assert custom.masks[i][tok], f"step {i}: token {tok} forbidden by the custom constraint"
        assert grammar_masks[i][tok], f"step {i}: token {tok} forbidden by the regex"
    assert custom.steps == [[]] + [[t] for t in tokens[: len(custom.steps) - 1]]
    event("no token in common" if error is not None else "generated")
    if error is not None:
        assert type(error).__name__ == "InvalidInput" and "allow no token" in str(error)
        assert last is not None and not (custom.masks[-1] & last).any()  # truly nothing in common
