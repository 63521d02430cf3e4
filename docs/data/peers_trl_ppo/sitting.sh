#!/bin/bash
# srl PPO and TRL 1.12 PPO on the preference task, one after the other on an otherwise idle machine.
# Run from the repository root; writes into docs/data/peers_trl_ppo/.
set -e
D=docs/data/peers_trl_ppo
date -u +%FT%TZ > $D/sitting_started
srl train configs/rlhf_preference.yaml --quiet --run-dir $D/srl
OMP_NUM_THREADS=2 /work/trl112-venv/bin/python scripts/peers/trl_ppo_preference.py --total-episodes 15000 \
    --max-seconds 600 --seed 0 --out $D/trl_s0.jsonl
OMP_NUM_THREADS=2 /work/trl112-venv/bin/python scripts/peers/trl_ppo_preference.py --generate-only --repeats 20 \
    > $D/trl_generate_only.json
date -u +%FT%TZ > $D/sitting_ended
rm -rf $D/srl/checkpoints $D/srl/tb  # (done by hand after this sitting: they are not kept here)
