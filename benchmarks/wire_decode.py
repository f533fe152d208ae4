"""Cost of the worker wire's decoder on hostile and wide frames (moved here from the security
tests, which check what is refused and what decodes, not how fast).

    python benchmarks/wire_decode.py
    python benchmarks/wire_decode.py --repeat 5

Prints the time to refuse each hostile payload (declared 4 GiB strings and 4-billion-item
containers, deep nesting, unknown types) and the decode time of frames growing 4x at a time;
linear cost shows as a per-byte time that stays flat. Goals: each refusal under 0.5 s, the
2 MB frame of 400k containers under 3 s.
"""

from __future__ import annotations

import argparse
import time

import msgpack

from pie_core.runtime.process.wire import MAX_DEPTH, Codec, ProtocolError

HOSTILE = {
    "declares 4 billion items": b"\xdd\xff\xff\xff\xff" + b"\x00" * 16,
    "declares 4 billion pairs": b"\xdf\xff\xff\xff\xff" + b"\x00" * 16,
    "declares a 4 GiB string": b"\xdb\xff\xff\xff\xff" + b"a" * 16,
    "declares a 4 GiB ext": b"\xc9\xff\xff\xff\xff\x01" + b"\x00" * 16,
    "nests past the depth limit": b"\x91" * (MAX_DEPTH + 1) + b"\xc0",
    "nests past msgpack's stack": b"\x91" * 5000 + b"\xc0",
    "unknown ext type": msgpack.packb(msgpack.ExtType(42, b"x")),
}


def _codec() -> Codec:
    def from_ref(rid: int, kind: str) -> object:
        raise ProtocolError(f"unknown handle {rid}")

    return Codec(lambda obj: None, from_ref)


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (the best is shown)")
    args = parser.parse_args()
    codec = _codec()

    def refuse(payload: bytes) -> None:
        try:
            codec.decode(payload)
        except ProtocolError:
            return
        raise AssertionError("a hostile payload decoded")

    print(f"{'hostile payload':32} {'refused in':>12}")
    for why, payload in HOSTILE.items():
        print(f"{why:32} {_best(lambda: refuse(payload), args.repeat) * 1e3:9.3f} ms")
    print(f"\n{'containers':>10} {'bytes':>10} {'decode':>10} {'ns/byte':>8}")
    for n in (12_500, 50_000, 200_000):
        frame = msgpack.packb([[i, "ab", [None]] for i in range(n)])
        took = _best(lambda: codec.decode(frame), args.repeat)
        print(f"{2 * n:>10} {len(frame):>10} {took * 1e3:8.1f} ms {took / len(frame) * 1e9:8.1f}")


if __name__ == "__main__":
    main()
