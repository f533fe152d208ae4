"""What ``print`` and writes to ``sys.stdout``/``sys.stderr`` become: Stdout events one per line
(a partial line goes out on ``flush()`` and when main ends; a line longer than 64 KiB in
chunks), Stderr events one per write, all of the text however long a single write is."""

import sys

from inferlet import session


async def main(input):
    print("short line")
    print("x" * 20000)  # longer than any 8 KiB buffer
    print("y" * 70000)  # longer than one 64 KiB event
    sys.stdout.write("partial")
    sys.stdout.flush()
    session.send("sent between")
    print(" and the rest")
    sys.stderr.write("e" * 10000)
    print("é" * 5000)  # two bytes per character
    print("unterminated", end="")
    return "done"
