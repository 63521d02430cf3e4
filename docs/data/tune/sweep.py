"""The full grid sweep ``srl tune`` is checked against: every layout of ``srl.tune.grid`` trained for the same
seconds (``srl bench train``, a fresh process each), one JSON line per layout: samples trained per second (what
``srl tune`` ranks by) and env steps sampled per second.

    python docs/data/tune/sweep.py configs/cartpole_ppo.yaml 15 > docs/data/tune/sweep_cartpole.jsonl
"""

import json
import sys
import time

from srl.api.config import load_config
from srl.bench.throughput import bench_train
from srl.tune import grid

config, seconds = sys.argv[1], float(sys.argv[2])
start = time.time()
for settings in grid(load_config(config)):
    sets = [f"{k}={v}" for k, v in settings.items()]
    result = bench_train(config, seconds, ["runtime=local", *sets])
    line = {k: result[k] for k in ("trained_samples_per_second", "train_fps", "policy_version", "lag_mean")}
    print(json.dumps({"set": sets, **line, "wall": round(time.time() - start, 1)}), flush=True)
