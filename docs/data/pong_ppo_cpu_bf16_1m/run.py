"""Pong in bfloat16 to the env steps of the float32 CPU-hour run (982k), seed 1, with the learning-rate schedule of
``configs/pong_ppo_cpu.yaml`` untouched (it anneals over ``run.total_env_steps``, 10M, so that cannot be the stop).

    python docs/data/pong_ppo_cpu_bf16_1m/run.py RUN_DIR

A thread watches the run's ``metrics.jsonl`` and asks for a stop (``train(..., stop=event)``) once a record passes
982,016 env steps; the run then ends as requested, with its final evaluation."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from srl.api.config import load_config
from srl.runtime.train import train

STEPS = 982_016  # where the float32 hour ended


def main() -> None:
    run = Path(sys.argv[1])
    cfg = load_config("configs/pong_ppo_cpu.yaml", ["model.cnn_dtype=bfloat16"])
    stop = threading.Event()

    def watch() -> None:
        metrics = run / "metrics.jsonl"
        while not stop.is_set():
            lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
            if lines and json.loads(lines[-1]).get("env_steps", 0) >= STEPS:
                stop.set()
            time.sleep(2.0)

    threading.Thread(target=watch, daemon=True).start()
    summary = train(cfg, run, progress=None, stop=stop)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
