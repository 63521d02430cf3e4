#!/usr/bin/env bash
# CartPole PPO (configs/cartpole_ppo.yaml) solved under each runtime, seeds 1-5, one fresh process per run:
# env steps and seconds to solved, and the mean policy lag. As root (the namespace cluster), from the repository
# root, with nothing else running. Writes one JSON object per setting into docs/data/runtimes_solve/.
set -euo pipefail
out=docs/data/runtimes_solve
solve() { srl bench solve --config configs/cartpole_ppo.yaml --runs 5 --json "$@"; }
solve > $out/local.json
solve --set workers.actors=2 > $out/local_2_actors.json
solve --set runtime=ray > $out/ray.json
python -m srl.testing.netcluster up --nodes 3
trap 'python -m srl.testing.netcluster down' EXIT
python -m srl.testing.netcluster exec 0 -- srl bench solve --config configs/cartpole_ppo.yaml --runs 5 --json \
    --set runtime=ray --set ray.address=198.18.0.1:6379 --set ray.actor_nodes=2 --set ray.actors_per_node=1 \
    --set ray.node_resource=srl_actor --set ray.trainer_resource=srl_trainer > $out/netcluster.json
