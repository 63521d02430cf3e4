#!/bin/bash
# sittings 4 and 5 (2026-12-01): TRL first, then srl, then TRL and srl again; 240 s each, nothing else running
cd /work/main
for n in 4 5; do
OUT=/work/peers/runs/sitting$n
mkdir -p $OUT
date > $OUT/started
/work/trl-venv/bin/python scripts/peers/trl_arithmetic.py --model /work/peers/arith2_sft --digits 2 --max-new 4 --lr 2e-4 --minibatches 2 --max-steps 100000 --max-seconds 240 --seed 1 --out $OUT/trl.jsonl > $OUT/trl.out 2>&1
python -m srl.cli.main train /tmp/lm/sitting_srl.yaml --run-dir $OUT/srl --set run.max_wall_seconds=240 --set run.total_env_steps=2000000 --quiet > $OUT/srl.out 2>&1
date > $OUT/finished
done
