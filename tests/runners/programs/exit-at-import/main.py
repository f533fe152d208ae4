"""The entry module calls ``sys.exit(3)`` as it is imported, before ``main`` exists: the run ends
with the Error event ``SystemExit: 3``, as a ``sys.exit(3)`` in ``main`` does."""

import sys

sys.exit(3)


async def main(input):
    return "unreachable"
