"""The table of run.sh's rounds: python docs/data/pong_ceiling_issue17/summarize.py DIR

The 2-core ceiling of a precision: two cores divided by the core-seconds one env step costs when each stage runs on
one thread (stepping the env, one forward pass per slot, and the PPO update with all its epochs), that is, every
stage perfectly overlapped on the two cores with no overhead at all.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def rows(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def line(label: str, values: list[float]) -> float:
    med = statistics.median(values)
    print(f"{label:34s} {' / '.join(f'{v:,.0f}' for v in values):28s} median {med:,.0f}")
    return med


def main() -> None:
    d = Path(sys.argv[1])
    env = [r["gymnasium_steps_per_second"] for r in rows(d, "env")]
    line("env alone (gymnasium, 4 envs)", env)
    sb3 = line("SB3 zoo atari, 2 threads", [r["env_steps_per_second"] for r in rows(d, "sb3")])
    for p in ("f32", "bf16"):
        compute = rows(d, f"compute_{p}")
        line(f"{p}: inference samples/s", [r["inference_samples_per_second"] for r in compute])
        line(f"{p}: update samples/s", [r["update_samples_per_second"] for r in compute])
        ceilings = [
            2.0 / (1 / e + 1 / c["inference_samples_per_second"] + 1 / c["update_samples_per_second"])
            for e, c in zip(env, compute, strict=True)
        ]
        ceiling = line(f"{p}: 2-core ceiling", ceilings)
        train = rows(d, f"train_{p}")
        fps = line(f"{p}: srl env steps/s", [r["train_fps"] for r in train])
        trained = line(f"{p}: srl trained/s", [r["trained_samples_per_second"] for r in train])
        print(
            f"  {p}: srl / SB3 {fps / sb3:.2f}x sampled, {trained / sb3:.2f}x trained; "
            f"ceiling / SB3 {ceiling / sb3:.2f}x; srl / ceiling {fps / ceiling:.2f}"
        )


if __name__ == "__main__":
    main()
