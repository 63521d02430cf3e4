#!/usr/bin/env bash
# The measurements of docs/benchmarks.md "Population-based training" (nothing else running on the machine).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/data/population
# what copies cost: 3 rounds of 40 s, a population that copies beside one whose worker never copies (~8 minutes)
python scripts/bench_population.py --config configs/cartpole_pbt.yaml --config configs/halfcheetah_pbt.yaml \
    --seconds 40 --rounds 3 --out $out/overhead.jsonl
# PBT against random search on HalfCheetah-v5, 4 x 1M env steps each, and the shipped PPO config at 1M (~50 minutes)
python scripts/bench_pbt.py --seeds 1 2 3 --out $out/halfcheetah.jsonl --keep $out/halfcheetah_seed1
srl plot $out/halfcheetah_seed1 --population --out docs/img/halfcheetah_pbt_lineage.png
# one more PBT seed with a return gap a copy must clear (~8 minutes alone)
python scripts/bench_pbt.py --seeds 1 --methods pbt --set population.min_gap=500 --out $out/halfcheetah_min_gap.jsonl
# two more seeds (2026-12-05; PBT seed 5 and the shipped config's seeds 4-5 were not run), appended to the same file
python scripts/bench_pbt.py --seeds 4 --methods pbt random --out $out/halfcheetah.jsonl
python scripts/bench_pbt.py --seeds 5 --methods random --out $out/halfcheetah.jsonl
# PBT with a warmup: no copy before 250k of a member's env steps (~45 minutes)
python scripts/bench_pbt.py --seeds 1 2 3 --methods pbt --set population.warmup=250000 \
    --out $out/halfcheetah_warmup.jsonl
