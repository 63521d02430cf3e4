"""Medians of the three interleaved rounds of run_medians.sh: python docs/data/peers_issue17/summarize_medians.py DIR"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def rows(folder: Path, name: str) -> list[dict]:
    path = folder / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def show(label: str, values: list[float]) -> float:
    med = statistics.median(values) if values else float("nan")
    print(f"{label:38s} {' / '.join(f'{v:,.2f}' for v in values):40s} median {med:,.2f}")
    return med


def main() -> None:
    d = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "medians"
    srl = show("CartPole srl solved s", [r["per_run"][0]["solved_wall_seconds"] for r in rows(d, "cartpole_srl")])
    sb3 = show("CartPole SB3 solved s", [r["solved_wall_seconds"] for r in rows(d, "cartpole_sb3")])
    print(f"  srl / SB3 time: {srl / sb3:.2f}x")
    srl = show("HalfCheetah srl env steps/s", [r["train_fps"] for r in rows(d, "halfcheetah_srl")])
    show("HalfCheetah srl trained/s", [r["trained_samples_per_second"] for r in rows(d, "halfcheetah_srl")])
    sf = show("HalfCheetah SF env steps/s", [r["env_steps_per_second"] for r in rows(d, "halfcheetah_sf")])
    print(f"  srl / SF: {srl / sf:.2f}x")
    sb3 = show("Pong SB3 env steps/s", [r["env_steps_per_second"] for r in rows(d, "pong_sb3")])
    for name in ("pong_srl", "pong_srl_bf16"):
        fps = show(f"{name} env steps/s", [r["train_fps"] for r in rows(d, name)])
        trained = show(f"{name} trained/s", [r["trained_samples_per_second"] for r in rows(d, name)])
        print(f"  {name} / SB3: {fps / sb3:.2f}x sampled, {trained / sb3:.2f}x trained")


if __name__ == "__main__":
    main()
