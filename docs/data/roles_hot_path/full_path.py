"""The full sampling path alone (actors -> policy worker -> a discarding trainer, local runtime), as `srl bench
sampling` measures it, with each worker's time: `python full_path.py CONFIG LABEL SECONDS`, run from a checkout
with PYTHONPATH set to it. pong_full_path_abba.txt: 12 runs on configs/pong_ppo_cpu.yaml, 8 s each, in the order
before, after, after, before (x3)."""

import sys, dataclasses
from srl.api.config import load_config
from srl.runtime.plan import make_plan
from srl.bench.throughput import _RateController
from srl.runtime.local import run_local

plan = make_plan(load_config(sys.argv[1]))
c = _RateController(plan.cfg, 3.0, float(sys.argv[3]))
run_local(dataclasses.replace(plan, null_trainer=True), c, None)
rec = c.record()
print(
    sys.argv[2],
    f"{c.rate():.0f}",
    {k: round(v, 3) for k, v in rec.items() if ("/" in k or "mean_batch" in k) and isinstance(v, float)},
)
