#!/bin/bash
# srl bench compute, before (a git worktree of the commit before the change at /tmp/srl-head: git worktree add /tmp/srl-head 0c38642) and after (/work/main), interleaved; each runs from its own tree (python -m puts the cwd first on sys.path)
:
for r in 1 2 3; do
  for cfg in configs/cartpole_masked_lstm.yaml configs/popgym_repeat_previous.yaml configs/pong_lstm_cpu.yaml; do
    for code in before after; do
      if [ $code = before ]; then P=/tmp/srl-head; else P=/work/main; fi
      s=6; [ $cfg = configs/pong_lstm_cpu.yaml ] && s=12
      (cd $P && PYTHONPATH=$P python -m srl.cli.main bench compute --config $cfg --seconds $s --json) | python -c "import json,sys; d=json.loads(sys.stdin.read()); print(json.dumps({'code':'$code','config':'$cfg','round':$r,'update':d['update_samples_per_second'],'infer':d['inference_samples_per_second']}))"
    done
  done
done
