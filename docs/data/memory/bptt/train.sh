#!/bin/bash
# srl bench train on the masked CartPole LSTM config, before (/tmp/srl-head: git worktree add /tmp/srl-head 0c38642) and after, interleaved
:
for r in 1 2 3; do
  for code in before after; do
    if [ $code = before ]; then P=/tmp/srl-head; else P=/work/main; fi
    (cd $P && PYTHONPATH=$P python -m srl.cli.main bench train --config configs/cartpole_masked_lstm.yaml --seconds 20 --json) | python -c "import json,sys; d=json.loads(sys.stdin.read()); print(json.dumps({'code':'$code','round':$r,'train_fps':d['train_fps'],'trained':d.get('trained_samples_per_second'),'versions':d['policy_version'],'tf':d['time_fractions']}))"
  done
done
