cd /work/main
for s in 1 2 3; do
  rm -rf /tmp/peer/ours_vmas_$s
  /usr/bin/time -f "%e" -o /tmp/peer/ours_vmas_$s.time python -m srl.cli.main train configs/vmas_navigation_ippo.yaml --set seed=$s --set run.total_env_steps=60000 --run-dir /tmp/peer/ours_vmas_$s --quiet > /tmp/peer/ours_vmas_$s.log 2>&1
  /work/peer-venv/bin/python scripts/peers/torchrl_mappo.py --env vmas_navigation --frames 60000 --seed $s --out /tmp/peer/trl_mappo_vmas_$s.json --quiet > /dev/null 2>&1
  /work/peer-venv/bin/python scripts/peers/torchrl_mappo.py --env vmas_navigation --frames 60000 --seed $s --ippo --num-epochs 10 --out /tmp/peer/trl_ippo10_vmas_$s.json --quiet > /dev/null 2>&1
done
echo done > /tmp/peer/vmas.done
