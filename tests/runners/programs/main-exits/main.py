"""main ends by ``sys.exit`` or ``KeyboardInterrupt`` after sending output (a partial last line
too) and while holding pages. They end the inferlet, not the server: ``sys.exit()``,
``sys.exit(0)`` (or ``False``) end the run as ``return None`` does; another status ends it
with an Error event ``SystemExit: <status>``, and ``KeyboardInterrupt`` with
``KeyboardInterrupt``. The output goes out first and the pages return to the pool."""

import sys

from inferlet import Context, Model, Sampler, runtime, session


def interrupt():
    raise KeyboardInterrupt


HOW = {
    "exit-3": lambda: sys.exit(3),
    "exit-message": lambda: sys.exit("no input given"),
    "exit-0": lambda: sys.exit(0),
    "exit-none": lambda: sys.exit(),
    "exit-false": lambda: sys.exit(False),
    "interrupt": interrupt,
}


async def main(input):
    ends = HOW[input["how"]]
    model = Model.load(runtime.models()[0])
    ctx = Context(model)
    ctx.user("Hold a few pages.")
    tokens = await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
    session.send(f"generated {tokens}")
    print("a whole line")
    print("and a partial one", end="")
    ends()
    return "unreachable"
