#!/bin/bash
# issue 17, HalfCheetah: the env-only ceiling beside Sample Factory's training rate, three interleaved rounds in
# one sitting, from a frozen copy of the code (2026-12-03). Raw lines: docs/data/halfcheetah_ceiling/*.jsonl.
rm -rf /tmp/srl-ceil && mkdir /tmp/srl-ceil && (cd /work/main && git ls-files | tar cf - -T - | (cd /tmp/srl-ceil && tar xf -))
cd /tmp/srl-ceil
export PYTHONPATH=/tmp/srl-ceil
OUT=${OUT:-/work/exp/ceil}
mkdir -p $OUT
SRL="python -m srl.cli.main"
for r in 1 2 3; do
  # the env alone: one process over 16 envs (Gymnasium), and EnvPool with one thread per core
  $SRL bench env --env HalfCheetah-v5 --set workers.envs_per_slot=16 --seconds 5 --json >> $OUT/env.jsonl 2>>$OUT/err
  # Sample Factory, sf_examples MuJoCo defaults
  /work/peer-sf/bin/python scripts/peers/sf_halfcheetah.py --seconds 60 --warmup 20 --train-dir /tmp/sf >> $OUT/sf.jsonl 2>>$OUT/err
  # srl as shipped, and with EnvPool's env
  $SRL bench train --config configs/halfcheetah_ppo.yaml --seconds 60 --json >> $OUT/srl.jsonl 2>>$OUT/err
  $SRL bench train --config configs/halfcheetah_ppo.yaml --seconds 60 --set env.backend=envpool --json >> $OUT/srl_envpool.jsonl 2>>$OUT/err
done
echo DONE > $OUT/done
