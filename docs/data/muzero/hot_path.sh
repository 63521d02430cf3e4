#!/bin/bash
# The replay path before and after the refresh mailbox and keyed step reads (issue 55): `srl bench train` on DQN
# CartPole, 3 alternating rounds of the previous commit (BASE, a worktree) and this tree. Usage: hot_path.sh BASE
set -euo pipefail
BASE=$1
for round in 1 2 3; do
  for tree in "$BASE" "$(pwd)"; do
    echo "round $round $tree"
    (cd "$tree" && PYTHONPATH="$tree" python -m srl.cli.main bench train --config configs/cartpole_dqn.yaml \
      --seconds 30 --json | tail -1)
  done
done
