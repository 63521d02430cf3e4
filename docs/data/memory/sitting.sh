#!/bin/bash
# srl (configs/cartpole_masked_lstm.yaml, local runtime) and SB3-contrib RecurrentPPO (the RL Zoo's
# CartPoleNoVel-v1 settings) on CartPole with velocities hidden, seeds 1-3 interleaved, nothing else running
cd /work/main
OUT=/work/peers/runs/memory
mkdir -p $OUT
date > $OUT/started
for seed in 1 2 3; do
  python -m srl.cli.main train configs/cartpole_masked_lstm.yaml --run-dir $OUT/srl_s$seed --set seed=$seed --quiet > $OUT/srl_s$seed.out 2>&1
  /work/sb3-venv/bin/python scripts/peers/sb3_recurrent.py --seed $seed --steps 300000 > $OUT/sb3_s$seed.jsonl 2>$OUT/sb3_s$seed.err
done
for core in lstm none; do
  python -m srl.cli.main bench sampling --config configs/cartpole_masked_lstm.yaml --set model.core=$core --json --seconds 8 > $OUT/sampling_$core.jsonl 2>$OUT/sampling_$core.err
  python -m srl.cli.main bench compute --config configs/cartpole_masked_lstm.yaml --set model.core=$core --json --seconds 8 > $OUT/compute_$core.jsonl 2>$OUT/compute_$core.err
done
date > $OUT/finished
