#!/usr/bin/env bash
# The cost of a result (docs/benchmarks.md): core-seconds and energy to target, one fresh process per seed.
srl bench solve --config configs/cartpole_ppo.yaml --runs 5 --json >> solve.jsonl
srl bench solve --config configs/cartpole_dqn.yaml --runs 3 --json >> solve.jsonl
srl bench solve --config configs/pendulum_sac.yaml --runs 3 --json >> solve.jsonl
srl bench solve --config configs/halfcheetah_ppo.yaml --runs 3 --set run.target_return=3000 --json >> solve.jsonl
# the layout of least energy per sample trained, beside the shipped one
srl tune configs/halfcheetah_ppo.yaml --rank energy --seconds 60 --tries 3 --json > tune_halfcheetah.json
# overhead: srl bench train on the commit before the cost accounting (6d110d2, its own checkout) and after,
# alternating (overhead.jsonl: 3 configs, rounds 2-4 counted, round 1 shared the machine; overhead_hc.jsonl:
# HalfCheetah again, 4 rounds, the new code first in each)
#   PYTHONPATH=TREE python -m srl.cli.main bench train --config CONFIG --seconds 15 --json
