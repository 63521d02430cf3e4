#!/bin/bash
# One `srl bench solve --runs 3` per line of overrides read from stdin: docs/data/cartpole_sweep_issue17/sweep.sh < a.txt
cd "$(dirname "$0")/../../.."  # the repository root
while read -r line; do
  r=$(python -m srl.cli.main bench solve --config configs/cartpole_ppo.yaml --runs 3 $(for kv in $line; do echo --set $kv; done) --json 2>/dev/null)
  echo "$line => $(echo "$r" | python -c 'import json,sys; d=json.load(sys.stdin); print(d["median_solved_wall_seconds"], [ (round(p["solved_wall_seconds"] or 0,2), p["solved_env_steps"]) for p in d["per_run"]])')"
done
