cd /work/main
/work/rllib-venv/bin/python scripts/peers/rllib_connect_four.py --env-steps 1000000 --num-env-runners 2 --seed 1 --out /tmp/peer/rllib_c4_1.json --eval-games 400 > /tmp/peer/rllib.log 2>&1
rm -rf /tmp/peer/ours_c4_500k
python -m srl.cli.main train configs/connect_four_selfplay.yaml --set run.total_env_steps=500000 --run-dir /tmp/peer/ours_c4_500k --quiet > /tmp/peer/ours_c4_500k.log 2>&1
python -m srl.cli.main eval /tmp/peer/ours_c4_500k --opponent random --episodes 400 > /tmp/peer/ours_c4_500k.random.json
echo done > /tmp/peer/rllib.done
