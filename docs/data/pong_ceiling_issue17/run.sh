#!/bin/bash
# issue 17, Pong: the 2x-SB3 goal beside the 2-core compute ceiling. Three interleaved rounds in one sitting, from a
# frozen copy of the code, nothing else running: the env alone (one slot of 4, as pong_ppo.yaml steps it), the
# config's inference and update cost on one thread (float32 and bfloat16), srl's run as shipped and in bfloat16,
# and SB3 with the zoo's atari settings. Raw lines beside this script; the table:
# python docs/data/pong_ceiling_issue17/summarize.py docs/data/pong_ceiling_issue17
rm -rf /tmp/srl-pong && mkdir /tmp/srl-pong && (cd /work/main && git ls-files | tar cf - -T - | (cd /tmp/srl-pong && tar xf -))
cd /tmp/srl-pong
export PYTHONPATH=/tmp/srl-pong
OUT=${OUT:-/work/exp/pong_ceiling}
mkdir -p $OUT
SRL="python -m srl.cli.main"
P=configs/pong_ppo.yaml
BF="--set model.cnn_dtype=bfloat16"
for r in 1 2 3; do
  $SRL bench env --config $P --seconds 10 --json >> $OUT/env.jsonl 2>>$OUT/err
  $SRL bench compute --config $P --seconds 20 --json >> $OUT/compute_f32.jsonl 2>>$OUT/err
  $SRL bench compute --config $P --seconds 20 $BF --json >> $OUT/compute_bf16.jsonl 2>>$OUT/err
  $SRL bench train --config $P --seconds 60 --json >> $OUT/train_f32.jsonl 2>>$OUT/err
  $SRL bench train --config $P --seconds 60 $BF --json >> $OUT/train_bf16.jsonl 2>>$OUT/err
  /work/peer-sb3/bin/python scripts/peers/sb3_pong.py --seconds 60 --threads 2 >> $OUT/sb3.jsonl 2>>$OUT/err
done
echo DONE > $OUT/done
