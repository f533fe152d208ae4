import os

from inferlet import runtime, session


async def main(input: dict):
    child, mode = input["child"], input["mode"]
    if mode == "pids":  # the child's facts next to the parent's pid
        return {"parent": os.getpid(), "child": await runtime.spawn(child, {"mode": "facts"})}
    if mode == "crash":  # the child's death reaches the parent as an exception
        try:
            await runtime.spawn(child, {"mode": "exit"})
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "the child did not fail"
    if mode == "hold":  # the child holds pages until the parent is terminated
        session.send(f"parent {os.getpid()}")
        return await runtime.spawn(child, {"mode": "hold"})
    raise ValueError(f"unknown mode {mode!r}")
