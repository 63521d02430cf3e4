"""LightZero's AlphaZero on tic-tac-toe, trained with its own self-play config and measured against OpenSpiel's MCTS.

Not part of srl: run it in its own virtual environment (LightZero needs numpy<2, and DI-engine 0.5.3 pins
setuptools<=66.1.1, which torch 2.13 refuses, so DI-engine and lightzero go in without their pins):

    python -m venv lz && lz/bin/pip install torch==2.13.0 'numpy<2' pybind11 open_spiel <DI-engine's and
        lightzero's other requirements> && lz/bin/pip install --no-deps DI-engine==0.5.3 lightzero==0.2.0

The PyPI wheel of lightzero 0.2.0 carries no compiled AlphaZero tree, which its configs use (``mcts_ctree=True``),
and its Python tree does not run with its own policy (``get_next_action`` returns two values where the policy
unpacks three). Build the tree from LightZero's repository at the tag v0.2.0: copy ``CMakeLists.txt``, the two
``.cpp`` files and ``node_alphazero.h`` of ``lzero/mcts/ctree/ctree_alphazero/``, replace its
``add_subdirectory(pybind11)`` with ``find_package(pybind11 CONFIG REQUIRED)``, run ``cmake`` (with
``-Dpybind11_DIR=$(lz/bin/python -m pybind11 --cmakedir)``, Release) and ``make``; put the module in the installed
``lzero/mcts/ctree/ctree_alphazero/build/`` and the repository's ``ctree_alphazero/test/eval_alphazero_ctree.py``
beside it (the policy imports its path helper).

    # train with LightZero's zoo config (tictactoe_alphazero_sp_mode_config), saving the network every --every s
    python scripts/peers/lightzero_alphazero.py train --minutes 10 --every 120 --out runs/peers/lz_ttt_s0 --seed 0
    # each saved network, searching as LightZero's evaluator does, against OpenSpiel's MCTS bot (seats alternate)
    python scripts/peers/lightzero_alphazero.py eval runs/peers/lz_ttt_s0 --opponent-simulations 1000 --games 100

Training is LightZero's own entry (``lzero.entry.train_alphazero``) with its published settings; the only changes
are ``cuda=False`` and a learner that saves the network, with the wall time and env steps, every ``--every``
seconds, and stops the run after ``--minutes`` (LightZero's own ``stop_value`` may end it first).

The opponent is the same bot ``srl eval --opponent mcts:N`` plays: ``pyspiel.MCTSBot`` with UCT c = 2, one random
rollout per leaf, solving, N simulations a move. LightZero's network plays through its eval mode (its search of
``min(800, 4 x 25)`` = 100 simulations, the most visited move); the two games (LightZero's ``TicTacToeEnv`` and
OpenSpiel's state) are stepped together, the cells numbered alike (row * 3 + column).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _config(seed: int, out: Path):
    from zoo.board_games.tictactoe.config.tictactoe_alphazero_sp_mode_config import create_config, main_config

    main_config.policy.cuda = False
    main_config.exp_name = str(out / "lightzero")
    return main_config, create_config


class _TimeUp(Exception):
    pass


def train(args: argparse.Namespace) -> None:
    import importlib

    import torch
    from ding.worker import BaseLearner

    entry = importlib.import_module("lzero.entry.train_alphazero")  # the module (the package's name is the function)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    index = out / "snapshots.jsonl"

    class TimedLearner(BaseLearner):
        """LightZero's learner, saving the network every ``--every`` seconds and stopping at ``--minutes``."""

        next_save = args.every

        def train(self, data, envstep=-1, policy_kwargs=None):
            result = super().train(data, envstep, policy_kwargs)
            elapsed = time.perf_counter() - start
            if elapsed >= self.next_save or elapsed >= args.minutes * 60:
                name = f"snapshot_{int(elapsed):05d}.pth.tar"
                torch.save(self._policy.state_dict(), out / name)
                record = {"file": name, "wall_seconds": round(elapsed, 1), "env_steps": int(envstep)}
                with open(index, "a") as f:
                    f.write(json.dumps(record | {"train_iter": self.train_iter}) + "\n")
                TimedLearner.next_save += args.every
            if elapsed >= args.minutes * 60:
                raise _TimeUp
            return result

    entry.BaseLearner = TimedLearner
    try:
        entry.train_alphazero(list(_config(args.seed, out)), seed=args.seed, max_env_step=int(1e12))
    except _TimeUp:
        pass
    print(json.dumps({"out": str(out), "wall_seconds": round(time.perf_counter() - start, 1)}))


def evaluate(args: argparse.Namespace) -> None:
    import copy

    import numpy as np
    import pyspiel
    import torch
    from ding.config import compile_config
    from ding.policy import create_policy
    from easydict import EasyDict
    from zoo.board_games.tictactoe.envs.tictactoe_env import TicTacToeEnv

    torch.set_num_threads(args.threads)
    out = Path(args.run)
    cfg, create_cfg = _config(0, Path("/tmp/lightzero_eval"))
    cfg = compile_config(cfg, seed=0, env=None, auto=True, create_cfg=create_cfg, save_cfg=False)
    policy = create_policy(cfg.policy, enable_field=["learn", "eval"])
    game = pyspiel.load_game("tic_tac_toe")
    env_cfg = EasyDict(copy.deepcopy(dict(cfg.env)))
    env_cfg.battle_mode = "self_play_mode"
    for line in (out / "snapshots.jsonl").read_text().splitlines():
        snap = json.loads(line)
        state_dict = torch.load(out / snap["file"], map_location="cpu", weights_only=True)
        policy.learn_mode.load_state_dict(state_dict)
        wins = draws = losses = 0
        seat_scores = [0.0, 0.0]
        for g in range(args.games):
            bot = pyspiel.MCTSBot(
                game, pyspiel.RandomRolloutEvaluator(1, g), 2.0, args.opponent_simulations, 1000, True, g, False
            )
            env = TicTacToeEnv(env_cfg)
            obs = env.reset()
            state = game.new_initial_state()
            peer_seat = g % 2
            while not state.is_terminal():
                if state.current_player() == peer_seat:
                    action = int(policy.eval_mode.forward({0: obs})[0]["action"])
                else:
                    action = int(bot.step(state))
                state.apply_action(action)
                obs = env.step(action).obs
            outcome = np.sign(state.returns()[peer_seat])
            wins, draws, losses = wins + (outcome > 0), draws + (outcome == 0), losses + (outcome < 0)
            seat_scores[peer_seat] += (outcome + 1) / 2
        record = snap | {
            "opponent": f"mcts:{args.opponent_simulations}",
            "games": args.games,
            "win_rate": wins / args.games,
            "draw_rate": draws / args.games,
            "loss_rate": losses / args.games,
            "score": (wins + 0.5 * draws) / args.games,
            "score_moving_first": seat_scores[0] / ((args.games + 1) // 2),
            "score_moving_second": seat_scores[1] / (args.games // 2),
        }
        with open(out / "evals.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--minutes", type=float, default=30.0)
    t.add_argument("--every", type=float, default=120.0, help="seconds between saved networks")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2, help="torch threads")
    t.add_argument("--out", required=True)
    e = sub.add_parser("eval")
    e.add_argument("run")
    e.add_argument("--opponent-simulations", type=int, default=1000)
    e.add_argument("--games", type=int, default=100)
    e.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    train(args) if args.command == "train" else evaluate(args)


if __name__ == "__main__":
    main()
