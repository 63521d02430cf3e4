#!/usr/bin/env bash
# The hot path before and after roles became the unit of extension: `srl bench sampling` on CartPole, HalfCheetah
# and Pong (full sampling path, local runtime) and `srl bench train` on DQN CartPole, three rounds alternating the
# two checkouts. Usage: run.sh BEFORE_DIR AFTER_DIR OUT_DIR (each DIR a checkout: `git worktree add DIR COMMIT`).
set -u
before=$1 after=$2 out=$3
mkdir -p "$out"
bench() {  # side dir name args...
  local side=$1 dir=$2 name=$3; shift 3
  (cd "$dir" && PYTHONPATH="$dir" python -m srl.cli.main bench "$@" --json 2>/dev/null | tail -1 \
    | python -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(side='$side', bench='$name'); print(json.dumps(r))") \
    >> "$out/runs.jsonl" || echo "failed: $side $name" >&2
}
for round in 1 2 3; do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    bench "$side" "$dir" sampling_cartpole sampling --config configs/cartpole_ppo.yaml --seconds 5
    bench "$side" "$dir" sampling_halfcheetah sampling --config configs/halfcheetah_ppo.yaml --seconds 5
    bench "$side" "$dir" sampling_pong sampling --config configs/pong_ppo_cpu.yaml --seconds 5
    bench "$side" "$dir" train_dqn_cartpole train --config configs/cartpole_dqn.yaml --seconds 20
  done
done
