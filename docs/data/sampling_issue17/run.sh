#!/bin/bash
# issue 17, the sampling path against the best single-process vector-env loop: each env with its built-in layout
# (a policy worker) and with inference inline in two actors (a process per core), three interleaved rounds in one
# sitting, from a frozen copy of the code (2026-12-03). Raw lines: docs/data/sampling_issue17/*.jsonl.
rm -rf /tmp/srl-samp && mkdir /tmp/srl-samp && (cd /work/main && git ls-files | tar cf - -T - | (cd /tmp/srl-samp && tar xf -))
cd /tmp/srl-samp
export PYTHONPATH=/tmp/srl-samp
OUT=${OUT:-/work/exp/samp}
mkdir -p $OUT
B="python -m srl.cli.main bench sampling --seconds 5 --json"
INLINE="--set workers.actors=2 --set workers.ring_size=1 --set workers.policy_workers=0"
for r in 1 2 3; do
  $B --env CartPole-v1 >> $OUT/cartpole_builtin.jsonl 2>>$OUT/err
  $B --env CartPole-v1 $INLINE --set workers.envs_per_slot=64 >> $OUT/cartpole_inline.jsonl 2>>$OUT/err
  $B --env HalfCheetah-v5 >> $OUT/halfcheetah_builtin.jsonl 2>>$OUT/err
  $B --env HalfCheetah-v5 $INLINE --set workers.envs_per_slot=64 >> $OUT/halfcheetah_inline.jsonl 2>>$OUT/err
  $B --config configs/pong_ppo.yaml >> $OUT/pong_builtin.jsonl 2>>$OUT/err
  $B --config configs/pong_ppo.yaml $INLINE --set workers.envs_per_slot=32 >> $OUT/pong_inline.jsonl 2>>$OUT/err
done
echo DONE > $OUT/done
