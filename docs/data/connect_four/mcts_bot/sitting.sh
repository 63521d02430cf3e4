#!/usr/bin/env bash
# The shipped Connect Four league (an MCTS-100 bot in 60% of the games), three seeds one after the other,
# each evaluated with greedy moves against random, MCTS-100, MCTS-400 (seats alternating).
set -euo pipefail
out=${1:-/tmp/c4/seeds}
mkdir -p "$out"
for s in 1 2 3; do
  run="$out/seed$s"
  /usr/bin/time -f "%e s wall" srl train configs/connect_four_selfplay.yaml --set seed=$s --run-dir "$run" --quiet \
    > "$out/seed$s.train.json" 2> "$out/seed$s.time"
  srl eval "$run" --opponent random --episodes 200 > "$out/seed$s.vs_random.json"
  srl eval "$run" --opponent mcts:100 --episodes 100 > "$out/seed$s.vs_mcts100.json"
  srl eval "$run" --opponent mcts:400 --episodes 100 > "$out/seed$s.vs_mcts400.json"
done
