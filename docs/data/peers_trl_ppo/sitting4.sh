#!/bin/bash
# Sitting 4 (2026-12-03, AMD EPYC, AVX2): srl with the critic on its own thread and rows grouped by prompt length,
# beside TRL 1.12 PPO, three rounds in alternating order, and once srl with text.critic_thread=false.
# Run from the repository root of a frozen copy (PYTHONPATH pointing at it, models/ beside it);
# writes into docs/data/peers_trl_ppo/sitting4/.
set -e
D=docs/data/peers_trl_ppo/sitting4
mkdir -p $D
date -u +%FT%TZ > $D/sitting_started
lscpu | grep -E "Model name" > $D/cpu.txt
srl_run() {
    srl train configs/rlhf_preference.yaml --quiet --run-dir $D/$1 --set run.keep_checkpoints=1 "${@:2}" > /dev/null
    rm -rf $D/$1/checkpoints $D/$1/tb
}
trl_run() {
    OMP_NUM_THREADS=2 /work/trl112-venv/bin/python scripts/peers/trl_ppo_preference.py --total-episodes 15000 \
        --seed 0 --out $D/$1.jsonl 2> $D/$1_stderr.txt
}
srl_run srl_r1; trl_run trl_r1
trl_run trl_r2; srl_run srl_r2
srl_run srl_r3; trl_run trl_r3
srl_run srl_nothread --set text.critic_thread=false
date -u +%FT%TZ > $D/sitting_ended
