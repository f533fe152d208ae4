import importlib
import os

from inferlet import runtime


async def main(input: dict):
    out = {}

    def attempt(name, action):
        try:
            action()
            out[name] = "ok"
        except PermissionError:
            out[name] = "denied"

    scratch = runtime.scratch_dir()
    out["cwd_is_scratch"] = os.getcwd() == scratch
    attempt("write_scratch", lambda: open(os.path.join(scratch, "w.txt"), "w").write("x"))
    attempt("write_relative", lambda: open("rel.txt", "w").write("y"))
    attempt("read_program", lambda: open(__file__).read())
    attempt("import_stdlib", lambda: importlib.import_module("wave"))
    attempt("read_outside", lambda: open(input["outside"]).read())
    attempt("write_outside", lambda: open(input["outside"] + ".new", "w").write("x"))
    attempt("read_other_scratch", lambda: open(input["other_scratch"]).read())
    attempt("list_data_dir", lambda: os.listdir(input["data_dir"]))
    attempt("signal_server", lambda: os.kill(input["server_pid"], 0))
    return out
