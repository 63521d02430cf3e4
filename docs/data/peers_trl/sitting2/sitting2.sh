#!/bin/bash
# sitting 2: srl with 2 torch threads per worker vs TRL (2 threads), same as sitting 1 otherwise
cd /work/main
OUT=/work/peers/runs/sitting2
mkdir -p $OUT
date > $OUT/started
python -m srl.cli.main train /tmp/lm/sitting_srl.yaml --run-dir $OUT/srl --set run.max_wall_seconds=240 --set workers.torch_threads=2 --quiet > $OUT/srl.out 2>&1
/work/trl-venv/bin/python scripts/peers/trl_arithmetic.py --model /work/peers/arith2_sft --digits 2 --max-new 4 --lr 2e-4 --minibatches 2 --max-steps 100000 --max-seconds 240 --seed 1 --out $OUT/trl.jsonl > $OUT/trl.out 2>&1
date > $OUT/finished
