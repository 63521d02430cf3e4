#!/bin/bash
# one sitting: srl vs TRL GRPO on the 2-digit arithmetic task, same model (600-step SFT), same machine;
# srl with the reference's log-probs taken by the generator and shared prompt passes (2026-12-01, third sitting)
cd /work/main
OUT=/work/peers/runs/sitting3
mkdir -p $OUT
date > $OUT/started
python scripts/bench_generate.py --model /work/peers/arith2_sft --batch 128 --group 8 --digits 2 --new 4 --repeats 20 > $OUT/generate_srl_env.jsonl 2>$OUT/generate_srl_env.err
/work/trl-venv/bin/python scripts/peers/trl_arithmetic.py --model /work/peers/arith2_sft --generate-only --repeats 20 --seed 0 --digits 2 --max-new 4 > $OUT/generate_trl_env.jsonl 2>$OUT/generate_trl_env.err
python -m srl.cli.main train /tmp/lm/sitting_srl.yaml --run-dir $OUT/srl --set run.max_wall_seconds=240 --quiet > $OUT/srl.out 2>&1
/work/trl-venv/bin/python scripts/peers/trl_arithmetic.py --model /work/peers/arith2_sft --digits 2 --max-new 4 --lr 2e-4 --minibatches 2 --max-steps 100000 --max-seconds 240 --seed 1 --out $OUT/trl.jsonl > $OUT/trl.out 2>&1
date > $OUT/finished
