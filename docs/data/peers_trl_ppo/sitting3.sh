#!/bin/bash
# Sitting 3: srl (prompt columns trimmed) and TRL 1.12 PPO, one after the other.
# Run from the repository root; writes into docs/data/peers_trl_ppo/sitting3/.
set -e
D=docs/data/peers_trl_ppo/sitting3
mkdir -p $D
date -u +%FT%TZ > $D/sitting_started
srl train configs/rlhf_preference.yaml --quiet --run-dir $D/srl --set run.keep_checkpoints=1 > /dev/null
OMP_NUM_THREADS=2 /work/trl112-venv/bin/python scripts/peers/trl_ppo_preference.py --total-episodes 15000 \
    --seed 0 --out $D/trl_s0.jsonl 2> $D/trl_stderr.txt
date -u +%FT%TZ > $D/sitting_ended
for r in srl; do rm -rf $D/$r/checkpoints $D/$r/tb; done
