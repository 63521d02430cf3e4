#!/bin/bash
# issue 17 side by side, three interleaved rounds in one sitting, from a frozen copy of the code (2026-12-02 evening)
rm -rf /tmp/srl-peers && mkdir /tmp/srl-peers && (cd /work/main && git ls-files | tar cf - -T - | (cd /tmp/srl-peers && tar xf -))
cd /tmp/srl-peers
export PYTHONPATH=/tmp/srl-peers
OUT=${OUT:-/work/exp/peers3}  # then copied to docs/data/peers_issue17/medians/
SRL="python -m srl.cli.main"
for r in 1 2 3; do
  # CartPole: time from process start to solved
  $SRL bench solve --config configs/cartpole_ppo.yaml --runs 1 --set seed=$r --json >> $OUT/cartpole_srl.jsonl 2>>$OUT/err
  /work/peer-sb3/bin/python scripts/peer_sb3_cartpole.py --seed $r >> $OUT/cartpole_sb3.jsonl 2>>$OUT/err
  # HalfCheetah: env steps/s, SF with its sf_examples defaults
  $SRL bench train --config configs/halfcheetah_ppo.yaml --seconds 60 --json >> $OUT/halfcheetah_srl.jsonl 2>>$OUT/err
  /work/peer-sf/bin/python scripts/peers/sf_halfcheetah.py --seconds 60 --warmup 20 --train-dir /tmp/sf >> $OUT/halfcheetah_sf.jsonl 2>>$OUT/err
  # Pong: env steps/s, SB3 with the zoo's atari settings (pong_ppo.yaml is the same PPO), srl as shipped and in bf16
  $SRL bench train --config configs/pong_ppo.yaml --seconds 60 --json >> $OUT/pong_srl.jsonl 2>>$OUT/err
  $SRL bench train --config configs/pong_ppo.yaml --seconds 60 --set model.cnn_dtype=bfloat16 --json >> $OUT/pong_srl_bf16.jsonl 2>>$OUT/err
  /work/peer-sb3/bin/python scripts/peers/sb3_pong.py --seconds 60 >> $OUT/pong_sb3.jsonl 2>>$OUT/err
done
echo PEERSDONE > $OUT/done
