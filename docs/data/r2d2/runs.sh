#!/bin/bash
# Masked CartPole (velocities hidden), 3 seeds each, 200k env steps each without stopping at a target, one run at a
# time, local runtime: R2D2 with stored state and burn-in (the shipped config), R2D2 from zero state, and
# feed-forward DQN (configs/cartpole_dqn.yaml on the same env); then R2D2 on POPGym's RepeatPreviousEasy, 3 seeds,
# stopping at its target. Each run's metrics.jsonl and summary.json are kept under $OUT.
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-runs/r2d2}
mkdir -p "$OUT"
MASKED="env.id=srl.envs.partial:keep_dims"
for seed in 1 2 3; do
  srl train configs/cartpole_masked_r2d2.yaml --run-dir "$OUT/stored_$seed" --quiet --set seed=$seed \
    --set run.target_return=null
  srl train configs/cartpole_masked_r2d2.yaml --run-dir "$OUT/zero_$seed" --quiet --set seed=$seed \
    --set run.target_return=null --set r2d2.stored_state=false
  srl train configs/cartpole_dqn.yaml --run-dir "$OUT/dqn_$seed" --quiet --set seed=$seed \
    --set run.target_return=null --set run.total_env_steps=200000 --set "$MASKED" \
    --set 'env.kwargs={env: CartPole-v1, keep: [0, 2]}'
done
for seed in 1 2 3; do
  srl train configs/popgym_repeat_previous_r2d2.yaml --run-dir "$OUT/popgym_$seed" --quiet --set seed=$seed
done
date > "$OUT/finished"
