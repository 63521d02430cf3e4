#!/bin/bash
# issue 17, the thread hand-over (workers.autotune) on and off, interleaved, on an AVX2-only AMD EPYC (2026-12-03
# afternoon), nothing else running, from a frozen copy of the code: pong_ppo three rounds, then pong_ppo_cpu three
# rounds. Raw lines beside this script (on/off: pong_ppo; cpu_on/cpu_off: pong_ppo_cpu).
rm -rf /tmp/srl-at && mkdir /tmp/srl-at && (cd /work/main && git ls-files | tar cf - -T - | (cd /tmp/srl-at && tar xf -))
cd /tmp/srl-at
export PYTHONPATH=/tmp/srl-at
OUT=${OUT:-/work/exp/autotune}
mkdir -p $OUT
B="python -m srl.cli.main bench train --seconds 60 --json"
for r in 1 2 3; do
  $B --config configs/pong_ppo.yaml --set workers.autotune=true >> $OUT/on.jsonl 2>>$OUT/err
  $B --config configs/pong_ppo.yaml --set workers.autotune=false >> $OUT/off.jsonl 2>>$OUT/err
done
for r in 1 2 3; do
  $B --config configs/pong_ppo_cpu.yaml --set workers.autotune=true >> $OUT/cpu_on.jsonl 2>>$OUT/err
  $B --config configs/pong_ppo_cpu.yaml --set workers.autotune=false >> $OUT/cpu_off.jsonl 2>>$OUT/err
done
