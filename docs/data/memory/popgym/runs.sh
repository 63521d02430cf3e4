#!/bin/bash
# POPGym Easy tasks, one seed each, at most 150 s per run (it stops early at the config's target), one after
# the other: the shipped GRU configs, the same with an LSTM, and without a core (feed-forward)
cd /work/main
OUT=/work/peers/runs/popgym
mkdir -p $OUT
for cfg in repeat_previous stateless_cartpole; do
  for core in gru lstm none; do
    python -m srl.cli.main train configs/popgym_$cfg.yaml --run-dir $OUT/${cfg}_$core --set model.core=$core \
      --set run.max_wall_seconds=150 --quiet > $OUT/${cfg}_$core.out 2>&1
  done
done
date > $OUT/finished
