"""What the Stable-Baselines3 peer scripts for off-policy algorithms share: their options, the curve of finished
episodes, the stop at a wall-time deadline, the final evaluation and the one JSON line of the result.

Each script prints one JSON line at the end: {"peer": "sb3", "version": ..., "env": ..., "env_steps": ...,
"updates": ..., "wall_seconds": ..., "env_steps_per_second": ..., "updates_per_second": ...,
"samples_per_insert": ..., "train_return_mean": ..., "final_eval_returns": [...], "torch_threads": ...}; its
``--curve`` file gets one line per finished episode: {"wall_seconds", "env_steps", "return"}. Its docstring
states what it measures and with which settings.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import stable_baselines3
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy


def arguments(doc: str, minutes: float) -> argparse.Namespace:
    """``--minutes`` (``minutes`` by default), ``--seed``, ``--curve`` and ``--threads``, parsed; torch's threads
    set when ``--threads`` is given (torch's own default otherwise)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--minutes", type=float, default=minutes)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--curve", type=Path, default=None, help="one JSON line per finished episode")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return args


class Recorder(BaseCallback):
    """Every finished episode's return on the curve (seconds counted from ``start``, the script's first line);
    stops training at the first step after ``deadline``; keeps the last ``window`` returns."""

    def __init__(self, start: float, deadline: float, curve: Path | None, window: int) -> None:
        super().__init__()
        self.start, self.deadline = start, deadline
        self.curve = curve.open("w") if curve is not None else None
        self.returns: deque[float] = deque(maxlen=window)

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
                if self.curve is not None:
                    line = {"wall_seconds": round(time.time() - self.start, 1), "env_steps": int(self.num_timesteps)}
                    self.curve.write(json.dumps({**line, "return": float(episode["r"])}) + "\n")
                    self.curve.flush()
        return time.time() < self.deadline


def measure(
    model: Any,
    start: float,
    args: argparse.Namespace,
    env_id: str,
    window: int,
    eval_env: Callable[[], Any],
    eval_episodes: int,
    timesteps: int,
) -> None:
    """Train ``model`` until ``args.minutes`` after ``start`` (or ``timesteps``), then play ``eval_episodes``
    deterministic episodes on a fresh ``eval_env()`` and print the result line; ``window``: the finished episodes
    ``train_return_mean`` averages."""
    recorder = Recorder(start, start + 60.0 * args.minutes, args.curve, window)
    model.learn(total_timesteps=timesteps, callback=recorder)
    wall = time.time() - start
    model.get_env().close()
    env = eval_env()
    returns, _ = evaluate_policy(
        model, env, n_eval_episodes=eval_episodes, deterministic=True, return_episode_rewards=True
    )
    env.close()
    print(result(model, env_id, wall, recorder, returns), flush=True)


def result(model: Any, env_id: str, wall: float, recorder: Recorder, eval_returns: Sequence[float]) -> str:
    """The result line of a run of ``wall`` seconds: the measured samples per insert counts the items trained on
    per env step after learning starts (``batch_size * gradient_steps / train_freq`` by construction)."""
    steps, updates = int(model.num_timesteps), int(model._n_updates)
    learning = max(1, steps - int(model.learning_starts))
    return json.dumps(
        {
            "peer": "sb3",
            "version": stable_baselines3.__version__,
            "env": env_id,
            "env_steps": steps,
            "updates": updates,
            "wall_seconds": round(wall, 1),
            "env_steps_per_second": round(steps / wall, 1),
            "updates_per_second": round(updates / wall, 2),
            "samples_per_insert": round(updates * int(model.batch_size) / learning, 2),
            "train_return_mean": float(np.mean(recorder.returns)) if recorder.returns else None,
            "final_eval_returns": [float(r) for r in eval_returns],
            "torch_threads": torch.get_num_threads(),
        }
    )
