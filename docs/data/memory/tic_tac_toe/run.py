"""Tic-tac-toe by self-play against a PFSP league, without and with an LSTM: one JSON line per seed.

    python docs/data/memory/tic_tac_toe/run.py none >> runs.jsonl
    python docs/data/memory/tic_tac_toe/run.py lstm >> runs.jsonl
"""

import json
import sys
import time

import srl

core = sys.argv[1]
for seed in (1, 2, 3):
    cfg = {
        "seed": seed,
        "runtime": "inline",
        "env": {"id": "srl.envs.turns:game", "kwargs": {"name": "tic_tac_toe"}, "agent_id": True},
        "workers": {"envs_per_slot": 16, "segment_length": 16},
        "model": {"hidden": [128, 128], "core": core, "core_size": 64},
        "league": {"opponent": "pfsp", "check_every_versions": 10, "match_games": 32},
        "run": {"total_env_steps": 100_000},
    }
    start = time.time()
    s = srl.train(cfg, run_dir=f"runs/ttt_{core}_{seed}")
    row = {
        "core": core,
        "seed": seed,
        "wall": round(time.time() - start, 1),
        "fps": s.get("train_fps"),
        "vs_random_score": s.get("final_eval_vs_random_score"),
        "win_rate": s.get("final_eval_vs_random_win_rate"),
        "elo": s["league"]["learner_elo"],
        "pool": s["league"]["pool_size"],
        "error": s.get("error"),
    }
    print(json.dumps(row), flush=True)
