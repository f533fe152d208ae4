"""Reference sections "Forward", "Samplers" and "Probes", call by call, on the dummy backend.

The dummy's logits are a known function of each row's (token id, position)
(``pie_core.backend_kit.dummy.dummy_logits``), so every value read back is checked against numpy
over exactly the logits the spec says it is computed from.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferlet import (
    Context, Distribution, Entropy, Forward, Logits, Logprob, Logprobs, Model, Output, ProbeHandle,
    SampleHandle, Sampler, runtime,
)
from pie_core import brle
from pie_core.backend_kit.dummy import _table, dummy_logits
from pie_core.backend_kit.sampling import softmax


def _model() -> Model:
    return Model.load(runtime.models()[0])


def _expected_logits(dummy, tokens, positions) -> np.ndarray:
    vocab = dummy.engine.models[dummy.model].spec.vocab_size
    return dummy_logits(_table(vocab), np.asarray(tokens), np.asarray(positions)).astype(np.float64)


def _floats(raw: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(raw), dtype=np.float32).astype(np.float64)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def test_input_positions_continue_from_start_position_and_input_at_sets_them(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            ctx.append([1, 2, 3, 4, 5])
            await ctx.flush()
            fwd = ctx.forward()
            start = fwd.start_position()
            same = fwd.input([40, 41]) is fwd and fwd.input_at([42], [100]) is fwd
            hs = [fwd.probe(i, Logits()) for i in range(3)]
            out = await fwd.execute()
            return (
                isinstance(fwd, Forward), isinstance(out, Output), start, same,
                [out.logits(h).hex() for h in hs], ctx.seq_len,
            )

    is_forward, is_output, start, same, rows, seq_len = dummy.value(main)
    assert is_forward and is_output and same and start == 5
    expected = _expected_logits(dummy, [40, 41, 42], [5, 6, 100])
    assert all(np.array_equal(_floats(r), e) for r, e in zip(rows, expected))
    assert seq_len == 8


def test_execute_commits_the_pages_it_filled(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            await ctx.forward().input(list(range(1, 21))).execute()
            raw = ctx.inner()
            return ctx.seq_len, raw.committed_page_count(), raw.working_page_token_count(), ctx.page_size

    seq_len, committed, working, page_size = dummy.value(main)
    assert page_size == 16 and seq_len == 20 and committed == 1 and working == 4


def test_sample_handles_single_and_multi_index(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([7, 8, 9])
            one = fwd.sample([2], Sampler.argmax())
            many = fwd.sample([0, 1, 2], Sampler.argmax())
            also_one = fwd.sample(1, Sampler.argmax())
            out = await fwd.execute()
            return (
                isinstance(one, SampleHandle), out.token(one), out.tokens_at(one), out.token(many),
                out.tokens_at(many), out.token(also_one),
            )

    is_handle, token, token_list, multi_token, tokens, token_1 = dummy.value(main)
    best = _expected_logits(dummy, [7, 8, 9], [0, 1, 2]).argmax(axis=1).tolist()
    assert is_handle and token == best[2] and token_list == [best[2]]
    assert multi_token is None and tokens == best and token_1 == best[1]


def test_mask_applies_at_every_sampled_position_but_not_to_probes(dummy):
    async def main(_):
        model = _model()
        allowed = np.zeros(model.vocab_size, dtype=bool)
        allowed[[3, 1000, 2000]] = True
        with Context(model) as ctx:
            fwd = ctx.forward().input([5, 6, 7])
            same = fwd.mask(brle.encode(allowed)) is fwd
            h = fwd.sample([0, 1, 2], Sampler.argmax())
            p = fwd.probe(2, Logits())
            out = await fwd.execute()
            return same, out.tokens_at(h), out.logits(p).hex()

    same, tokens, raw = dummy.value(main)
    logits = _expected_logits(dummy, [5, 6, 7], [0, 1, 2])
    ids = np.array([3, 1000, 2000])
    assert same and tokens == ids[logits[:, ids].argmax(axis=1)].tolist()
    assert np.array_equal(_floats(raw), logits[2])  # probes read the raw logits


def test_a_row_mask_may_be_brle_runs_packed_bytes_or_a_numpy_uint8_array(dummy):
    async def main(_):
        model = _model()
        allowed = np.zeros(model.vocab_size, dtype=bool)
        allowed[[3, 1000, 2000]] = True
        packed = np.packbits(allowed, bitorder="little")
        with Context(model) as ctx:
            fwd = ctx.forward().input([5, 6, 7])
            hs = [fwd.sample([i], Sampler.argmax(), mask=m)
                  for i, m in enumerate([brle.encode(allowed), packed.tobytes(), packed])]
            p = fwd.probe(2, Distribution(k=2))
            out = await fwd.execute()
            return [out.token(h) for h in hs], out.raw.probes[0]

    tokens, raw_probe = dummy.value(main)
    logits = _expected_logits(dummy, [5, 6, 7], [0, 1, 2])
    ids = np.array([3, 1000, 2000])
    assert tokens == ids[logits[:, ids].argmax(axis=1)].tolist()
    ids_k, probs_k = raw_probe  # the host hands the SDK plain Python values, no numpy
    assert type(ids_k) is list and type(probs_k) is list and all(type(x) is float for x in probs_k)


def test_raw_output_has_no_generator_tokens_or_auto_sampler(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([1, 2])
            h = fwd.sample([1], Sampler.argmax())
            e = fwd.probe(0, Entropy())
            out = await fwd.execute()
            return out.tokens, out.auto_sampler, [list(t) for t in out.raw.tokens], len(out.raw.probes), out.token(h)

    tokens, auto, raw_tokens, n_probes, token = dummy.value(main)
    assert tokens == [] and auto is None and raw_tokens == [[token]] and n_probes == 1


def test_probes_read_what_the_spec_says_off_the_rows_logits(dummy):
    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([11, 12])
            h = {
                "logits": fwd.probe(1, Logits()),
                "full": fwd.probe(1, Distribution(1.0, 0)),
                "top": fwd.probe(1, Distribution(0.7, 5)),
                "one": fwd.probe(1, Logprob(42)),
                "many": fwd.probe(1, Logprobs([42, 7, 9000])),
                "entropy": fwd.probe(0, Entropy()),
            }
            out = await fwd.execute()
            return (
                all(isinstance(x, ProbeHandle) for x in h.values()),
                out.logits(h["logits"]).hex(), out.distribution(h["full"]), out.distribution(h["top"]),
                out.logprobs(h["one"]), out.logprobs(h["many"]), out.entropy(h["entropy"]),
            )

    handles, raw, (full_ids, full_p), (top_ids, top_p), one, many, entropy = dummy.value(main)
    logits = _expected_logits(dummy, [11, 12], [0, 1])
    vocab = logits.shape[1]
    assert handles
    # Logits(): native-endian f32 bytes, vocab_size * 4 long
    assert len(bytes.fromhex(raw)) == vocab * 4
    assert np.array_equal(np.frombuffer(bytes.fromhex(raw), dtype=np.float32), logits[1].astype(np.float32))
    # Distribution(temperature, k): top-k ids and probs; k = 0 is the full vocabulary
    p = softmax(logits[1])
    assert sorted(full_ids) == list(range(vocab)) and np.abs(np.array(full_p) - p[full_ids]).max() < 1e-6
    p7 = softmax(logits[1], 0.7)
    assert top_ids == np.argsort(-p7, kind="stable")[:5].tolist()
    assert np.abs(np.array(top_p) - p7[top_ids]).max() < 1e-6
    # Logprob(t): a length-1 list; Logprobs(ts): one per id, in the given order
    lp = _log_softmax(logits[1])
    assert len(one) == 1 and abs(one[0] - lp[42]) < 1e-5
    assert np.abs(np.array(many) - lp[[42, 7, 9000]]).max() < 1e-5
    # Entropy(): Shannon entropy of softmax(logits)
    p0 = softmax(logits[0])
    assert abs(entropy - float(-(p0 * np.log(p0)).sum())) < 1e-5


def test_greedy_and_degenerate_filters_pick_the_argmax(dummy):
    samplers = {
        "argmax": Sampler.argmax(),
        "greedy": Sampler.greedy(),
        "top_k_1": Sampler.top_k(0.9, 1),
        "tiny_top_p": Sampler.top_p(0.9, 1e-9),
        "min_p_1": Sampler.min_p(0.9, 1.0),
        "top_k_top_p": Sampler.top_k_top_p(0.9, 1, 0.5),
    }

    async def main(_):
        with Context(_model()) as ctx:
            fwd = ctx.forward().input([21, 22])
            hs = {name: fwd.sample([1], s) for name, s in samplers.items()}
            out = await fwd.execute()
            return {name: out.token(h) for name, h in hs.items()}

    tokens = dummy.value(main)
    best = int(_expected_logits(dummy, [21, 22], [0, 1])[1].argmax())
    assert tokens == {name: best for name in samplers}


def test_stochastic_samplers_stay_in_their_support_and_repeat_with_a_seed(dummy):
    k = 5

    async def main(_):
        results = []
        for _ in range(2):
            with Context(_model()) as ctx:
                fwd = ctx.forward().input([31, 32])
                hs = [
                    fwd.sample([1], Sampler.top_k(1.5, k, seed=11)),
                    fwd.sample([1], Sampler.top_k_top_p(1.5, k, 0.99, seed=12)),
                    fwd.sample([1], Sampler.top_p(1.0, 0.5, seed=13)),
                    fwd.sample([1], Sampler.min_p(1.0, 0.5, seed=14)),
                    fwd.sample([1], Sampler.multinomial(1.0, 6, seed=15)),
                ]
                out = await fwd.execute()
                results.append([out.tokens_at(h) for h in hs])
        return results

    first, second = dummy.value(main)
    assert first == second  # seeded draws repeat exactly
    logits = _expected_logits(dummy, [31, 32], [0, 1])[1]
    top_k = set(np.argsort(-logits)[:k].tolist())
    p = softmax(logits)
    order = np.argsort(-p)
    nucleus = set(order[: int(np.searchsorted(np.cumsum(p[order]), 0.5)) + 1].tolist())
    top_k_s, top_k_top_p_s, top_p_s, min_p_s, multi = first
    assert set(top_k_s) <= top_k and set(top_k_top_p_s) <= top_k
    assert set(top_p_s) <= nucleus
    assert p[min_p_s[0]] >= 0.5 * p.max()
    assert len(multi) == 6  # Sampler.multinomial(temperature, draws): draws tokens from one row


def test_reference_and_readme_sampler_spellings_agree():
    assert Sampler.top_p(0.6, 0.95) == Sampler.top_p(temperature=0.6, top_p=0.95)
    assert Sampler.top_k(0.6, 50) == Sampler.top_k(temperature=0.6, top_k=50)
    assert Sampler.min_p(0.6, 0.1) == Sampler.min_p(temperature=0.6, min_p=0.1)
    assert Sampler.top_k_top_p(0.6, 50, 0.95) == Sampler.top_k_top_p(temperature=0.6, top_k=50, top_p=0.95)
    assert Sampler.greedy() == Sampler.argmax()


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Sampler.top_p(-1.0, 0.9), "temperature must be >= 0"),
        (lambda: Sampler.top_p(0.6, 0.0), "top-p needs 0 < p <= 1"),
        (lambda: Sampler.top_k(0.6, 0), "top-k needs k >= 1"),
        (lambda: Sampler.min_p(0.6, 1.5), "min-p needs 0 <= p <= 1"),
        (lambda: Sampler.multinomial(1.0, 0), "multinomial needs draws >= 1"),
        (lambda: Sampler.multinomial(1.0, 1, seed=-1), "seed must be in"),
        (lambda: Distribution(0.0, 3).spec(0), "temperature must be > 0"),
        (lambda: Distribution(1.0, -1).spec(0), "k must be >= 0"),
    ],
)
def test_bad_sampler_and_probe_parameters_are_named(build, message):
    with pytest.raises(ValueError, match=message):
        build()
