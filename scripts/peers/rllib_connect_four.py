"""Peer baseline: RLlib's self-play example on OpenSpiel connect_four, timed step by step.

It sets up what RLlib's ``rllib/examples/multi_agent/self_play_with_open_spiel.py`` sets up
(new API stack), from RLlib's own public classes and example utilities:

* env: ``ray.rllib.env.wrappers.open_spiel.OpenSpielEnv(pyspiel.load_game("connect_four"))``
  (one env step = one move of whichever player is to move; an illegal move is replaced by a
  random legal one and costs the mover -0.1; no action masking);
* modules: ``main`` (default PPO torch module, ``fcnet_hiddens=[512, 512]``) and ``random``
  (``RandomRLModule``, samples the whole action space); only ``main`` is trained;
* matching: per episode ``main`` takes seat ``hash(episode.id_) % 2``, the opponent the other;
* league: ``SelfPlayCallback(win_rate_threshold=0.95)``: after an iteration whose ``win_rate``
  (main's wins over the last 100 finished episodes on the env runners) exceeds the threshold it
  freezes a copy of ``main`` as ``main_v<k>`` and from then on ``main`` meets a uniformly drawn
  frozen copy; ``league_size`` = 2 + number of frozen copies (the example counts league size 3
  as passing);
* PPO: RLlib's defaults (``train_batch_size_per_learner=4000`` env steps, minibatch 128,
  lr 5e-5, ...) except ``num_epochs=20``, as in the example; one env per env runner.

Unlike the example it drives ``algo.train()`` directly (the example's ``--no-tune`` path)
instead of through Tune, writes no checkpoints and plays no human games; at the end it can
play ``main`` greedily against a uniform random legal-move player with pyspiel directly.

    python scripts/peers/rllib_connect_four.py --env-steps 8000 --num-env-runners 1 \
        --seed 1 --out result.json [--eval-games 200]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--env-steps",
        type=int,
        default=2_000_000,
        help="stop once num_env_steps_sampled_lifetime reaches this (moves of both "
        "players; the example's default budget is 2,000,000)",
    )
    p.add_argument(
        "--num-env-runners", type=int, default=2, help="remote EnvRunner actors (the example's default is 2)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=str, default="rllib_connect_four.json")
    p.add_argument(
        "--win-rate-threshold",
        type=float,
        default=0.95,
        help="SelfPlayCallback's threshold for freezing main into the league (example: 0.95)",
    )
    p.add_argument(
        "--min-league-size",
        type=int,
        default=3,
        help="league size the example counts as passing; only reported, never stops the run",
    )
    p.add_argument(
        "--stop-at-league-size",
        action="store_true",
        help="also stop once the league reaches --min-league-size (the example's stop rule)",
    )
    p.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="logical CPUs for ray.init (default: env runners + 1 for the driver's learner)",
    )
    p.add_argument(
        "--eval-games",
        type=int,
        default=0,
        help="after training: games of greedy main vs a uniform random legal-move player",
    )
    p.add_argument(
        "--worker-logs",
        action="store_true",
        help="forward the EnvRunners' output to this terminal (off by default: OpenSpiel "
        "prints an exception line for every illegal move the wrapper replaces)",
    )
    p.add_argument(
        "--eval-unmasked",
        action="store_true",
        help="greedy eval without masking illegal moves (illegal argmax -> random legal "
        "move, as the example's human-play loop does); default: argmax over legal moves",
    )
    return p.parse_args(argv)


def build_config(args):
    import pyspiel
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.env.wrappers.open_spiel import OpenSpielEnv
    from ray.rllib.examples.multi_agent.utils import SelfPlayCallback
    from ray.rllib.examples.rl_modules.classes.random_rlm import RandomRLModule
    from ray.tune.registry import get_trainable_cls, register_env

    register_env("open_spiel_env", lambda _: OpenSpielEnv(pyspiel.load_game("connect_four")))

    def agent_to_module_mapping_fn(agent_id, episode, **kwargs):
        # As in the example: main sometimes starts, sometimes moves second.
        return "main" if hash(episode.id_) % 2 == agent_id else "random"

    config = (
        get_trainable_cls("PPO")
        .get_default_config()
        .framework("torch")
        .environment("open_spiel_env")
        .callbacks(functools.partial(SelfPlayCallback, win_rate_threshold=args.win_rate_threshold))
        .env_runners(num_env_runners=args.num_env_runners, num_envs_per_env_runner=1)
        .multi_agent(
            policies={"main", "random"},
            policy_mapping_fn=agent_to_module_mapping_fn,
            policies_to_train=["main"],
        )
        .rl_module(
            model_config=DefaultModelConfig(fcnet_hiddens=[512, 512]),
            rl_module_spec=MultiRLModuleSpec(
                rl_module_specs={
                    "main": RLModuleSpec(),
                    "random": RLModuleSpec(module_class=RandomRLModule),
                }
            ),
        )
        .training(num_epochs=20)
        # What run_rllib_example_script_experiment sets on a machine without GPUs.
        .resources(num_gpus=0)
        .learners(num_gpus_per_learner=0)
        .debugging(seed=args.seed)
    )
    return config


def _get(d, *keys, default=None):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def evaluate_vs_random(module, games, seed, masked=True):
    """Greedy ``main`` vs a uniform random legal-move player, seats alternating, in pyspiel."""
    import numpy as np
    import pyspiel
    import torch

    game = pyspiel.load_game("connect_four")
    rng = np.random.default_rng(seed + 12345)
    wins = draws = losses = 0
    by_seat = {0: [0, 0, 0], 1: [0, 0, 0]}  # wins, draws, losses with main as player 0 / 1
    main_moves = illegal_argmax = 0
    for g in range(games):
        main_seat = g % 2
        state = game.new_initial_state()
        while not state.is_terminal():
            player = state.current_player()
            legal = state.legal_actions()
            if player == main_seat:
                obs = np.asarray(state.observation_tensor(player), dtype=np.float32).reshape(1, -1)
                with torch.no_grad():
                    logits = module.forward_inference({"obs": torch.from_numpy(obs)})["action_dist_inputs"][0]
                logits = logits.numpy()
                best = int(np.argmax(logits))
                main_moves += 1
                if best not in legal:
                    illegal_argmax += 1
                    if masked:
                        best = int(legal[int(np.argmax(logits[legal]))])
                    else:
                        best = int(rng.choice(legal))
                state.apply_action(best)
            else:
                state.apply_action(int(rng.choice(legal)))
        r = state.returns()[main_seat]
        k = 0 if r > 0 else (1 if r == 0 else 2)
        by_seat[main_seat][k] += 1
        wins += k == 0
        draws += k == 1
        losses += k == 2

    def rates(w, d, lost):
        n = max(w + d + lost, 1)
        return {
            "games": w + d + lost,
            "win_rate": w / n,
            "draw_rate": d / n,
            "loss_rate": lost / n,
            "score": (w + 0.5 * d) / n,
        }

    return {
        "opponent": "uniform random legal move",
        "policy": "greedy argmax over " + ("legal moves" if masked else "all 7 columns (illegal -> random legal)"),
        **rates(wins, draws, losses),
        "as_first_player": rates(*by_seat[0]),
        "as_second_player": rates(*by_seat[1]),
        "illegal_argmax_fraction": illegal_argmax / max(main_moves, 1),
    }


def main(argv=None):
    args = parse_args(argv)
    import numpy as np
    import ray
    import torch

    try:
        import ray.rllib
    except ImportError as e:
        sys.exit(
            f"RLlib does not import ({e}). Ray's rllib extras are missing: run this with a venv "
            "made with --system-site-packages that has pandas pyarrow tensorboardX lz4 ormsgpack "
            "(see scripts/peers/RLLIB.md)."
        )

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    num_cpus = args.num_cpus or (args.num_env_runners + 1)
    curve = []
    result = {
        "peer": "rllib self_play_with_open_spiel (connect_four, new API stack)",
        "versions": {"python": platform.python_version(), "ray": ray.__version__, "torch": torch.__version__},
        "settings": {
            "env_steps_budget": args.env_steps,
            "num_env_runners": args.num_env_runners,
            "num_envs_per_env_runner": 1,
            "seed": args.seed,
            "ray_num_cpus": num_cpus,
            "win_rate_threshold": args.win_rate_threshold,
            "min_league_size": args.min_league_size,
            "algo": "PPO",
            "num_epochs": 20,
            "fcnet_hiddens": [512, 512],
        },
        "counters": {
            "env_steps": "num_env_steps_sampled_lifetime: env.step() calls on the EnvRunners (resets "
            "not counted); OpenSpielEnv applies one move per step, so this counts the moves "
            "of BOTH players (main's and the opponent's); the budget --env-steps is on it",
            "module_steps": "env_runners/num_module_steps_sampled_lifetime: per module, observations "
            "handed to that module after an env step (the reset observation and the "
            "empty terminal one are not counted), so the sum is env_steps - episodes "
            "and main's own moves = module_steps['main'] + the episodes main started",
            "main_steps": "module_steps['main'] (about half of env_steps; srl's run.total_env_steps "
            "counts the learner's own moves, so compare it with env_steps / 2)",
            "win_rate": "env_runners/win_rate: SelfPlayCallback's mean of (main's last reward == 1) "
            "over the last 100 finished training episodes against the current opponents",
            "league_size": "SelfPlayCallback's league_size: 2 (main, random) + frozen copies of main",
        },
        "curve": curve,
    }
    algo = None
    t_start = time.perf_counter()
    try:
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            ignore_reinit_error=True,
            object_store_memory=256 * 1024 * 1024,
            log_to_driver=args.worker_logs,
        )
        try:
            import pyspiel

            result["versions"]["open_spiel"] = getattr(pyspiel, "__version__", None)
        except Exception:
            pass
        config = build_config(args)
        result["settings"]["train_batch_size_per_learner"] = config.train_batch_size_per_learner
        result["settings"]["minibatch_size"] = config.minibatch_size
        result["settings"]["lr"] = config.lr
        result["settings"]["count_steps_by"] = config.count_steps_by
        algo = config.build_algo() if hasattr(config, "build_algo") else config.build()
        t_train = time.perf_counter()
        result["build_seconds"] = t_train - t_start
        env_steps = 0
        league_size = 2
        first_league = {}
        while env_steps < args.env_steps:
            t_it = time.perf_counter()
            res = algo.train()
            now = time.perf_counter()
            env_steps = int(
                res.get("num_env_steps_sampled_lifetime")
                or _get(res, "env_runners", "num_env_steps_sampled_lifetime", default=0)
            )
            league_size = int(res.get("league_size", league_size))
            row = {
                "iteration": int(res.get("training_iteration", len(curve) + 1)),
                "env_steps": env_steps,
                "main_steps": _num(_get(res, "env_runners", "num_module_steps_sampled_lifetime", "main")),
                "module_steps": {
                    str(k): _num(v)
                    for k, v in (
                        _get(res, "env_runners", "num_module_steps_sampled_lifetime", default={}) or {}
                    ).items()
                },
                "agent_steps": {
                    str(k): _num(v)
                    for k, v in (_get(res, "env_runners", "num_agent_steps_sampled_lifetime", default={}) or {}).items()
                },
                "episodes": _num(_get(res, "env_runners", "num_episodes_lifetime")),
                "wall_seconds": now - t_train,
                "iter_seconds": now - t_it,
                "league_size": league_size,
                "win_rate": _num(_get(res, "env_runners", "win_rate")),
                "episode_len_mean": _num(_get(res, "env_runners", "episode_len_mean")),
                # RLlib's own timers for this iteration (EMA-smoothed by RLlib's MetricsLogger).
                "sample_seconds": _num(_get(res, "timers", "env_runner_sampling_timer")),
                "learn_seconds": _num(_get(res, "timers", "learner_update_timer")),
            }
            curve.append(row)
            for size in range(3, league_size + 1):
                first_league.setdefault(str(size), {"env_steps": env_steps, "wall_seconds": row["wall_seconds"]})
            print(
                f"[rllib-c4] iter={row['iteration']} env_steps={env_steps} "
                f"main_steps={row['main_steps']} wall={row['wall_seconds']:.1f}s "
                f"league={league_size} win_rate={row['win_rate']}",
                flush=True,
            )
            if args.stop_at_league_size and league_size >= args.min_league_size:
                break
        total = time.perf_counter() - t_train
        result.update(
            {
                "total_wall_seconds": total,
                "env_steps": env_steps,
                "main_steps": curve[-1]["main_steps"] if curve else None,
                "env_steps_per_second": env_steps / total if total > 0 else None,
                "final_league_size": league_size,
                "passed_min_league_size": league_size >= args.min_league_size,
                "league_size_reached_at": first_league,
                "final_win_rate": curve[-1]["win_rate"] if curve else None,
            }
        )
        if args.eval_games > 0:
            module = algo.get_module("main")
            # Load the learner's current weights (env runners get them synced; be explicit).
            weights = algo.learner_group.get_weights(module_ids=["main"])
            if "main" in weights:
                module.set_state(weights["main"])
            t_eval = time.perf_counter()
            ev = evaluate_vs_random(module, args.eval_games, args.seed, masked=not args.eval_unmasked)
            ev["seconds"] = time.perf_counter() - t_eval
            result["eval_vs_random"] = ev
            print(f"[rllib-c4] eval vs random: {json.dumps(ev)}", flush=True)
    finally:
        if algo is not None:
            try:
                algo.stop()
            except Exception as e:
                print(f"[rllib-c4] algo.stop() failed: {e!r}", file=sys.stderr)
        ray.shutdown()
        result["script_wall_seconds"] = time.perf_counter() - t_start
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"[rllib-c4] wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
