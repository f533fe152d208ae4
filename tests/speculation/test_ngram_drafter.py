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
