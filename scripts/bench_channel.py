"""Per-record cost of the named-pipe channel (the per-step notification on the inference and sample streams).

    python scripts/bench_channel.py

One process sends one 4-word record and receives it, 20,000 times, three repetitions.
"""

from __future__ import annotations

import os
import tempfile
import time

from srl.base.channel import FifoChannel


def main(n: int = 20_000) -> None:
    with tempfile.TemporaryDirectory() as d:
        ch = FifoChannel.create(os.path.join(d, "fifo"), 4)
        try:
            for _ in range(3):
                t = time.perf_counter()
                for i in range(n):
                    ch.send((1, i % 3, 2, i % 100))
                    ch.recv(8, 0.0)
                print(f"send+recv per record: {(time.perf_counter() - t) / n * 1e6:.2f} us")
        finally:
            ch.close()
            ch.unlink()


if __name__ == "__main__":
    main()
