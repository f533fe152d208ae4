"""The system n-gram drafter: what it proposes, how its length adapts, when it pauses."""

from pie_core.speculation import ngram
from pie_core.speculation.ngram import NgramDrafter


def _text(s: str) -> list[int]:
    return [ord(c) for c in s]


def test_proposes_the_continuation_of_the_latest_earlier_occurrence():
    d = NgramDrafter()
    history = _text("abcdXYZ..abcdQRS..abcd")
    assert d.propose(history, 3) == _text("QRS")  # the latest "abcd" continued with QRS


def test_prefers_the_longest_matching_ngram():
    d = NgramDrafter()
    # "cd" last continued with "1", but the 4-gram "abcd" continued with "2"
    history = _text("abcd2...xcd1...abcd")
    assert d.propose(history, 1) == _text("2")


def test_proposes_nothing_without_a_match_or_room():
    d = NgramDrafter()
    assert d.propose(_text("abcdefgh"), 4) == []
    assert d.propose(_text("abab"), 0) == []


def test_length_grows_after_kept_proposals_and_shrinks_after_rejections():
    d = NgramDrafter()
    base = _text("0123456789abcdefghij0123")
    first = d.propose(base, 16)
    assert first == _text("4567")  # the starting length
    grown = d.propose(base + first + _text("8"), 16)  # all four kept: +2
    assert d.length == ngram.START_LENGTH + 2 and len(grown) == ngram.START_LENGTH + 2
    history = base + first + _text("8") + grown[:1] + _text("#")  # one of six kept
    d.propose(history, 16)
    assert d.length == ngram.START_LENGTH + 1 and d.proposed == 10 and d.kept == 5


def test_pauses_after_poor_proposals_and_pauses_longer_each_time():
    d = NgramDrafter()
    history = _text("ab1ab2ab3ab4ab5ab6ab7ab8ab")
    proposals = []
    for i in range(40):
        got = d.propose(history, 4)
        proposals.append(bool(got))
        history = history + [1000 + i] + _text("ab")  # never what it proposed
    # proposing every step would be 40; it backs off to ever rarer tries
    assert sum(proposals) <= 10 and proposals[0]
    gaps = [i for i, p in enumerate(proposals) if p]
    assert gaps[-1] - gaps[-2] > gaps[2] - gaps[1]


def test_a_context_cut_back_is_indexed_afresh():
    d = NgramDrafter()
    d.propose(_text("xyzQ..xyz"), 2)
    assert d.propose(_text("xyzR..xyz"), 2) == _text("R.")  # shorter than indexed: rebuilt


def test_the_index_stays_bounded(monkeypatch):
    monkeypatch.setattr(ngram, "WINDOW", 64)
    d = NgramDrafter()
    history: list[int] = []
    for i in range(2000):
        history.append((i * 7919) % 1000)
        d.propose(history, 1)
    assert all(len(t) <= 2 * 64 + 1 for t in d._index.values())


def test_drafting_pauses_when_its_steps_cost_more_than_they_yield():
    """A drafting step that takes 3x a plain one must yield 3 tokens: half-kept drafts of 4
    (3 tokens a step) just pay on a backend where drafts are cheap, not where they are dear."""

    def run(draft_cost: float) -> list[bool]:
        d = NgramDrafter()
        history = _text("0123456789abcdefghij")
        now, drafted = 0.0, []
        for _ in range(30):
            drafts = d.propose(history + _text("0123"), 4, now)
            drafted.append(bool(drafts))
            now += draft_cost if drafts else 1.0
            # keep two of the drafts, then something new: 3 tokens per drafting step
            history = history + _text("0123") + (drafts[:2] + [900 + len(history)] if drafts else [800 + len(history)])
        return drafted

    cheap, dear = run(1.5), run(4.0)
    assert sum(cheap) > 20  # pays: keeps drafting
    assert sum(dear) < 10  # costs more than it yields: backs off


def _kept_share_run(cost, keep: int, steps: int = 30) -> list[int]:
    """Drafts proposed per step when each proposal of up to 4 has its first ``keep`` kept."""
    d = NgramDrafter()
    history = _text("0123456789abcdefghij")
    counts = []
    for _ in range(steps):
        drafts = d.propose(history + _text("0123"), 4, None, True, cost=cost)
        counts.append(len(drafts))
        history = history + _text("0123") + drafts[:keep] + [1000 + len(history)]
    return counts


def test_under_a_batch_drafts_are_as_many_as_pay_for_their_rows():
    """With the batch's cost: a full CPU batch (every row adds 1/16 of a step) drafts only
    what is likely kept; a GPU batch (rows nearly free) drafts even poorly kept drafts; an
    unknown cost leaves the drafter's own rules."""
    cpu = lambda d: 1 + d / 16  # noqa: E731
    gpu = lambda d: 1 + d / 1000  # noqa: E731
    poor_on_cpu = _kept_share_run(cpu, keep=0)
    assert sum(poor_on_cpu[5:]) <= 4 and max(poor_on_cpu[5:]) <= 1  # nothing kept: a rare single probe at most
    good_on_cpu = _kept_share_run(cpu, keep=4)
    assert all(c >= 2 for c in good_on_cpu[3:])  # all kept: it drafts as far as the text lets it
    some_on_gpu = _kept_share_run(gpu, keep=1)
    assert sum(c > 0 for c in some_on_gpu) > 20  # one of several kept still pays where rows are free
    unknown = _kept_share_run(lambda d: None, keep=4)
    assert unknown == _kept_share_run(None, keep=4)


def test_the_count_of_drafts_maximises_expected_tokens_per_step_time():
    d = NgramDrafter()
    d.accepted, d.cut = 1, 1  # p = 0.5
    drafts = list(range(8))
    # E[tokens](k) = 1 + 0.5 + ... + 0.5^k against a cost of 1 + 0.2 k: k = 1 (1.5 / 1.2 = 1.25) beats k = 2 (1.75 / 1.4)
    assert d._worth(drafts, lambda k: 1 + 0.2 * k) == [0]
    assert d._worth(drafts, lambda k: 1 + 0.8 * k) == []  # 1.5 / 1.8 < 1: no draft pays
    assert d._worth(drafts, lambda k: 1.0) == drafts  # free rows: all of them


def test_in_a_batch_a_draft_must_pay_for_the_slowdown_of_every_request():
    d = NgramDrafter()
    d.accepted, d.cut = 9, 1  # p = 10/12: drafts are usually kept
    drafts = list(range(4))
    compute_bound = lambda k: 1 + k / 16  # noqa: E731  # a row costs what a request's row does
    assert d._worth(drafts, compute_bound, requests=1) == drafts  # alone, the context gains
    assert d._worth(drafts, compute_bound, requests=16) == []  # in a full batch, 16 requests wait for it
    half = lambda k: 1 + k / 32  # noqa: E731  # rows at half a request's cost (a weight-bound step)
    assert d._worth(drafts, half, requests=16) != []  # kept 5 times in 6: worth it
    d.accepted, d.cut = 1, 5
    assert d._worth(drafts, half, requests=16) == []  # kept 1 time in 4: not worth it


def test_a_refused_drafter_probes_now_and_then_and_resumes_when_the_text_starts_repeating():
    d = NgramDrafter()
    d.accepted, d.cut = 0.0, 5.0  # what a preamble that repeated nothing left behind
    steep = lambda k: 1 + k / 16  # noqa: E731
    decisions = [len(d._worth(list(range(4)), steep, requests=16)) for _ in range(40)]
    probes = [i for i, n in enumerate(decisions) if n]
    assert decisions[: ngram.FIRST_PROBE - 1] == [0] * (ngram.FIRST_PROBE - 1)
    assert all(decisions[i] == 1 for i in probes) and 2 <= len(probes) <= 5  # single drafts, ever rarer
    assert probes[1] - probes[0] < probes[2] - probes[1]
    # the probes come back kept (the reply started copying): evidence mounts and drafting resumes
    for _ in range(6):
        d.accepted, d.cut = ngram._FADE * d.accepted + 4, ngram._FADE * d.cut
    assert len(d._worth(list(range(4)), lambda k: 1 + k / 64, requests=16)) >= 2
