#!/bin/bash
# The capacity model's all-reduce term against measurement (docs/scaling.md, "The all-reduce, measured").
# 1. the ring alone: two and four real trainer processes, each config's gradient, three rounds
for r in 1 2 3; do
  for c in cartpole_ppo halfcheetah_ppo pong_ppo; do
    srl bench allreduce --config configs/$c.yaml --trainers 2,4 --json
  done
done > docs/data/capacity_allreduce/bench.jsonl
# 2. inside training runs: data-parallel trainers (one actor each), the seconds each trainer spent in reductions
for r in 1 2 3; do
  for n in 2 4; do
    srl train configs/cartpole_ppo.yaml --run-dir runs/allreduce_cartpole_${n}_${r} --set seed=$r \
        --set workers.trainers=$n --set workers.actors=$n --set run.total_env_steps=60000 --set run.target_return=null
    python -c "import json,sys; s=json.load(open('runs/allreduce_cartpole_${n}_${r}/summary.json')); \
print(json.dumps({'config': 'cartpole_ppo', 'trainers': $n, 'seed': $r, **{k: s.get(k) for k in \
('bytes_reduced_per_update', 'reduce_seconds_per_update', 'train_fps', 'policy_version', 'time_fractions')}}))"
  done
done > docs/data/capacity_allreduce/runs.jsonl
