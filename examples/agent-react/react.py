"""The ReAct protocol shared by the inferlet and by ``benchmarks/agents.py``'s client loop.

Both sides parse actions, run tools and word observations with these functions, so they run the
same agent: what differs is only where the loop lives.

The tools run offline: ``search`` looks the query up in a small encyclopedia, ``lookup`` finds a
word in the page the last search returned, ``finish`` ends the task. Every call (``finish``
aside) waits ``delay`` seconds first, standing in for a real tool's latency.
"""

from __future__ import annotations

import asyncio
import re

SYSTEM = (
    "You are a ReAct agent. Work in turns. In each turn write one line 'Thought: <reasoning>' and then "
    "one or more lines 'Action: <tool>[<input>]'. Tools: search[topic] returns a short article, "
    "lookup[word] returns the sentence of the last article holding that word, finish[answer] gives the "
    "final answer. After each turn you get 'Observation: ...'."
)

PAGES = {
    "eiffel tower": "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was completed in 1889 "
                    "for the World's Fair and is 330 metres tall.",
    "statue of liberty": "The Statue of Liberty is a copper statue on Liberty Island in New York. It was "
                         "dedicated in 1886 and was a gift from France.",
    "paris": "Paris is the capital of France, on the Seine. About 2.1 million people live in the city.",
    "new york": "New York City is the most populous city in the United States, with about 8.3 million people.",
    "kv cache": "A KV cache keeps the keys and values of past tokens so a transformer decodes each new "
                "token without recomputing the prefix.",
}

_ACTION = re.compile(r"Action:\s*([A-Za-z_]+)\[([^\]\n]{0,200})\]")


def actions(text: str, most: int) -> list[tuple[str, str]]:
    """The turn's actions, at most ``most``; a turn naming none searches for its own text."""
    found = [(name.lower(), arg.strip()) for name, arg in _ACTION.findall(text)][: max(1, most)]
    return found or [("search", " ".join(text.split())[:60])]


def finished(calls: list[tuple[str, str]]) -> str | None:
    """The answer of a ``finish`` action, None without one."""
    return next((arg for name, arg in calls if name == "finish"), None)


def search(query: str) -> str:
    q = query.lower()
    hits = [page for topic, page in PAGES.items() if topic in q or q in topic]
    if hits:
        return hits[0]
    words = set(re.findall(r"[a-z]+", q))
    scored = max(PAGES, key=lambda topic: len(words & set(topic.split())))
    return PAGES[scored] if words & set(scored.split()) else f"Could not find [{query[:60]}]."


def lookup(word: str, page: str) -> str:
    sentences = [s.strip() for s in page.split(".") if word.lower() in s.lower() and word.strip()]
    return (sentences[0] + ".") if sentences else f"No sentence with [{word[:40]}]."


class Tools:
    """One agent's tools; ``lookup`` reads the page its last ``search`` returned."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.page = ""

    async def call(self, name: str, arg: str) -> str:
        await asyncio.sleep(self.delay)
        if name == "search":
            self.page = search(arg)
            return self.page
        if name == "lookup":
            return lookup(arg, self.page)
        return f"Unknown tool {name[:40]!r}; use search, lookup or finish."

    async def run(self, calls: list[tuple[str, str]]) -> list[str]:
        """Every call at once (a turn's actions are independent); results in call order."""
        return list(await asyncio.gather(*(self.call(name, arg) for name, arg in calls)))


def observation(results: list[str]) -> str:
    return "Observation: " + " | ".join(results)
