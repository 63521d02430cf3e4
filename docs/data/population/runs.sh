#!/usr/bin/env bash
# The measurements of docs/benchmarks.md "Population-based training" (nothing else running on the machine).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/data/population
# what copies cost: 3 rounds of 40 s, a population that copies beside one whose worker never copies (~8 minutes)
python scripts/bench_population.py --config configs/cartpole_pbt.yaml --config configs/halfcheetah_pbt.yaml \
    --seconds 40 --rounds 3 --out $out/overhead.jsonl
# PBT against random search on HalfCheetah-v5, 4 x 1M env steps each, and the shipped PPO config at 1M: random
# search and the shipped config (2026-12-04 and -05; the seeds 4-5 runs were appended)
python scripts/bench_pbt.py --seeds 1 2 3 --methods random shipped --out $out/halfcheetah.jsonl
python scripts/bench_pbt.py --seeds 4 5 --methods random --out $out/halfcheetah.jsonl
# PBT as it is, one copy per round (2026-12-05, ~12 minutes a seed)
python scripts/bench_pbt.py --seeds 1 2 3 4 5 --methods pbt --out $out/halfcheetah_rounds.jsonl \
    --keep $out/halfcheetah_rounds_seed1
srl plot $out/halfcheetah_rounds_seed1 --population --out docs/img/halfcheetah_pbt_lineage.png
# the same with a warmup: no copy before 250k of a member's env steps (seed 4 first, then seeds 1-3)
python scripts/bench_pbt.py --seeds 4 1 2 3 --methods pbt --set population.warmup=250000 \
    --out $out/halfcheetah_rounds_warmup.jsonl --keep $out/halfcheetah_rounds_warmup_seed4
# Before the fix (the commit before 96779a2: up to two copies per round): PBT's rows of halfcheetah.jsonl (seeds
# 1-3 ran with random search and the shipped config, `--seeds 1 2 3`; seed 4 with `--seeds 4 --methods pbt
# random`), a return gap a copy must clear, and a warmup (no copy before 250k of a member's env steps)
python scripts/bench_pbt.py --seeds 1 --methods pbt --set population.min_gap=500 --out $out/halfcheetah_min_gap.jsonl
python scripts/bench_pbt.py --seeds 1 2 3 4 --methods pbt --set population.warmup=250000 \
    --out $out/halfcheetah_warmup.jsonl --keep $out/halfcheetah_warmup_seed1
srl plot $out/halfcheetah_warmup_seed1 --population --out docs/img/halfcheetah_pbt_warmup_lineage.png
