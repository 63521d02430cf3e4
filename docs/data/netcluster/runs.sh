#!/usr/bin/env bash
# The measurements of docs/benchmarks.md "Across a cluster of network namespaces" (as root; nothing else running;
# about 75 minutes). The first command ran before the parameter service sent each version once per subscriber.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/data/netcluster
python scripts/bench_netcluster.py train --config configs/halfcheetah_ppo.yaml --config configs/pong_ppo_cpu.yaml \
    --seconds 40 --rounds 3 --rate-mbit 1000 --rate-mbit 100 --rate-mbit 20 --out $out/train.jsonl
python scripts/bench_netcluster.py params --config configs/halfcheetah_ppo.yaml --actor-nodes 2 --actor-nodes 4 \
    --seconds 30 --out $out/params.jsonl
# the costs files were measured again on 2026-12-05 (the inline actor timed whole), on the same CPU
for config in halfcheetah_ppo pong_ppo_cpu; do
  for i in 1 2 3; do
    srl bench costs --config configs/$config.yaml --set workers.policy_workers=0 --set workers.actors=2 --seconds 3 --json
  done > $out/costs_$config.jsonl
done
# after the parameter service's one-copy fix: Pong on the limited links again, then longer at 20 Mbit/s
python scripts/bench_netcluster.py train --config configs/pong_ppo_cpu.yaml --only-netcluster \
    --rate-mbit 100 --rate-mbit 20 --rounds 3 --seconds 40 --out $out/train_one_copy.jsonl
python scripts/bench_netcluster.py train --config configs/pong_ppo_cpu.yaml --only-netcluster \
    --rate-mbit 20 --rounds 3 --seconds 150 --out $out/train_20mbit_150s.jsonl
python scripts/bench_netcluster.py faults --rounds 3 --out $out/faults.jsonl
