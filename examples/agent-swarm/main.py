"""Agent swarm: a team of agents, one inferlet each, that pass the work round a ring.

The coordinator (the inferlet you launch) spawns ``agents`` copies of itself with
``role="agent"`` and pushes the task onto agent 0's queue. Each agent keeps its own context for
the whole run (every turn prefills only the note it received), and per note:

1. ``messaging.pull`` its queue (``<run>/agent/<index>``) and add the note to its context;
2. write its step (``max_tokens``), then ``messaging.broadcast`` it on ``<run>/progress``, which
   the coordinator subscribed to before starting anyone;
3. ``messaging.push`` the note to the next agent's queue, or, after the last of ``hops``
   hand-offs, push the result to ``<run>/result`` and send a stop round the ring.

Topics are the user's own (another user's inferlets never see them); ``<run>`` is the
coordinator's instance id, so teams running at once do not mix.
"""

import asyncio
import json

from inferlet import Context, Model, Sampler, messaging, runtime


def _queue(run: str, index: int) -> str:
    return f"{run}/agent/{index}"


async def agent(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    run, me, team = input["run"], input["index"], input["agents"]
    nxt = _queue(run, (me + 1) % team)
    turns = 0
    stopping = False  # this agent sent the stop: it ends when the stop comes back round
    with Context(model) as ctx:
        ctx.system(f"You are agent {me + 1} of a team of {team} working on: {input['task']} "
                   "Each turn a colleague hands you a note; add one short, concrete next step.")
        while True:
            note = json.loads(await messaging.pull(_queue(run, me)))
            if note.get("stop"):
                if not stopping:
                    messaging.push(nxt, json.dumps({"stop": True}))
                break
            ctx.user(f"From {note['from']}: {note['text']}")
            text = await ctx.generate(Sampler.argmax(), max_tokens=input["max_tokens"]).collect_text()
            ctx.seal()
            turns += 1
            left = note["hops_left"] - 1
            messaging.broadcast(f"{run}/progress", json.dumps({"agent": me, "hops_left": left, "text": text}))
            if left > 0:
                messaging.push(nxt, json.dumps({"hops_left": left, "from": f"agent {me + 1}", "text": text}))
            else:
                messaging.push(f"{run}/result", json.dumps({"agent": me, "text": text}))
                stopping = True
                messaging.push(nxt, json.dumps({"stop": True}))
    return {"agent": me, "turns": turns}


async def coordinator(input: dict) -> dict:
    if input["agents"] < 1 or input["hops"] < 1:
        raise ValueError("agents and hops must be at least 1")
    run = f"swarm-{runtime.instance_id()}"
    progress = messaging.subscribe(f"{run}/progress")
    members = [asyncio.ensure_future(runtime.spawn("agent-swarm", {**input, "role": "agent", "index": i, "run": run}))
               for i in range(input["agents"])]
    messaging.push(_queue(run, 0), json.dumps({"hops_left": input["hops"], "from": "the user", "text": input["task"]}))
    steps = [json.loads(await progress.next()) for _ in range(input["hops"])]
    result = json.loads(await messaging.pull(f"{run}/result"))
    finished = await asyncio.gather(*members)
    progress.unsubscribe()
    return {"result": result["text"], "steps": steps, "turns": [m["turns"] for m in finished]}


async def main(input: dict) -> dict:
    if input["role"] == "agent":
        return await agent(input)
    if input["role"] != "coordinator":
        raise ValueError(f"role must be 'coordinator' or 'agent', got {input['role']!r}")
    return await coordinator(input)
