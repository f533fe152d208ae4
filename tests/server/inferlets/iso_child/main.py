import os
import resource
import tempfile

from inferlet import Context, Model, Sampler, runtime, session


async def main(input: dict):
    mode = input["mode"]
    if mode == "facts":
        return {
            "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "user": runtime.username(),
            "cpu_limit": resource.getrlimit(resource.RLIMIT_CPU)[0], "cwd": os.getcwd(),
            "scratch": runtime.scratch_dir(), "tmpdir": tempfile.gettempdir(), "env": sorted(os.environ),
        }
    if mode == "exit":
        os._exit(7)
    if mode == "hold":
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user("hold these pages")
            await ctx.generate(Sampler.argmax(), max_tokens=2, stop=[]).collect_tokens()
            session.send(f"child {os.getpid()} holding")
            return await session.receive()
    raise ValueError(f"unknown mode {mode!r}")
