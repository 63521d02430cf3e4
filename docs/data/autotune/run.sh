#!/bin/bash
# workers.autotune on and off, interleaved, three rounds: end-to-end train FPS and where the time went.
for r in 1 2 3; do
  for a in true false; do
    srl bench train --config configs/pong_ppo_cpu.yaml --seconds 60 --set workers.autotune=$a --json
    srl bench train --config configs/cartpole_ppo.yaml --seconds 20 --set workers.autotune=$a --json
  done
done > docs/data/autotune/bench_train.jsonl
