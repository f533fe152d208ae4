"""Market-aware inferlet: read the KV-page market, and tell it what matters when.

When contexts do not all fit on the device the engine auctions its KV pages; every inferlet
pays for pages with credits (``inferlet.scheduling``). This one has an urgent question and some
background notes to summarise later:

1. The notes are prefilled, then suspended: their pages go back to the pool while they wait.
2. The question's prefill bids high (``ctx.set_bid``) so it is not the one held back under
   contention; its reply is paced by its horizon (the generator's default bid).
3. A tool call (here a short sleep) runs inside ``with ctx.idle():``: no pass runs meanwhile,
   so the context bids nothing and is the first to give its pages up if someone needs them.
   The follow-up then continues the same conversation.
4. The notes are summarised: the first pass brings their pages back without being asked.

It returns the market as seen before and after, the credits spent, and the three replies.
"""

import asyncio

from inferlet import Context, Model, Sampler, runtime, scheduling


def market(model: Model, ctx: Context) -> dict:
    """The market as this inferlet sees it now."""
    return {
        "balance": scheduling.balance(model),
        "dividend": scheduling.dividend(model),
        "rent": scheduling.rent(ctx),
        "latency_s": scheduling.latency(ctx),
        "price": scheduling.price(),
    }


async def lookup(seconds: float) -> str:
    """A stand-in for a slow tool (a search, an API call)."""
    await asyncio.sleep(seconds)
    return "Source: a cache keeps recent results close, so repeated work is skipped."


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    sampler, max_tokens = Sampler.argmax(), input["max_tokens"]
    with Context(model) as notes, Context(model) as chat:
        before = market(model, notes)

        notes.user(f"Summarise these notes in one line: {input['notes']}")
        await notes.flush()
        notes.suspend()  # not needed for a while: give its pages back now
        parked = notes.suspended

        chat.user(input["question"])
        chat.set_bid(input["bid"])  # the prefill is urgent; later passes bid the default again
        answer = await chat.generate(sampler, max_tokens=max_tokens, horizon=max_tokens).collect_text()
        chat.seal()

        with chat.idle():  # waiting on a tool: this context runs nothing, so it bids nothing
            found = await lookup(input["tool_seconds"])
        chat.user(f"{found} Does that agree with your answer? Reply briefly.")
        follow_up = await chat.generate(sampler, max_tokens=max_tokens).collect_text()

        summary = await notes.generate(sampler, max_tokens=max_tokens).collect_text()  # restored first
        after = market(model, notes)
        return {
            "answer": answer,
            "follow_up": follow_up,
            "summary": summary,
            "notes_suspended_while_answering": parked,
            "notes_resumed": not notes.suspended,
            "market_before": before,
            "market_after": after,
            "credits_spent": before["balance"] - after["balance"],  # new pages, plus rent under contention
        }
