"""Peer baseline: QMIX or VDN from BenchMARL (PyPI ``benchmarl`` 1.5) on a VMAS task.

It runs in its own venv and is not part of srl. The venv reuses the system torch, vmas and gymnasium, and pins torch
so that pip keeps the CPU wheel:

    python3.11 -m venv --system-site-packages VENV
    VENV/bin/pip install 'benchmarl==1.5.*' torch==2.13.0     # brings torchrl 0.11.1, tensordict 0.11.0

Usage:
    VENV/bin/python scripts/peers/benchmarl_qmix.py --algo qmix --task navigation --seed 1 \\
        --frames 600000 --out runs/peers/benchmarl_qmix_navigation_s1.jsonl

The settings are the package's own: its ``base_experiment.yaml`` (lr 5e-5, gamma 0.99, soft target updates with tau
0.005, epsilon 0.8 -> 0.01 over a third of the frames, 6,000 frames collected by 10 vectorized worlds per iteration,
then 1,000 updates of 128 transitions from a uniform replay of 1M), its ``qmix.yaml`` / ``vdn.yaml`` and its VMAS
task yaml, with the MLP of ``layers/mlp.yaml`` (256, 256, tanh) shared by the agents. On top the script sets only
the frame budget and the seed, and turns off what needs a display or the network (rendering, wandb): evaluation
keeps the package's interval (120k frames) and episodes (10, greedy).

A frame is one step of one VMAS world, whatever its number of agents: what srl counts as an env step. BenchMARL's
QMIX trains on the mean of its agents' rewards; the returns below are per agent (the mean over agents of each
agent's episode return), as BenchMARL logs them.

Output: one JSON line per iteration, with env_steps (frames collected), wall_seconds (since the experiment was
set up; evaluation included), return_mean (the mean return of the episodes that ended in the iteration's batch,
null where none ended) and, after an evaluation, eval_return_mean; and a last line with "final": true.
"""

import argparse
import json
import math
import os
import tempfile
import time

import torch
from benchmarl.algorithms import QmixConfig, VdnConfig
from benchmarl.environments import VmasTask
from benchmarl.experiment import Callback, Experiment, ExperimentConfig
from benchmarl.models.mlp import MlpConfig


class JsonLines(Callback):
    """Writes the run's progress, one line per iteration (see the module's docstring)."""

    def __init__(self, path):  # a path, not an open file: the package pickles its callbacks into its run folder
        super().__init__()
        self.path = path
        self.start = time.perf_counter()
        self.eval_return = None

    def write(self, **line):
        line["wall_seconds"] = round(time.perf_counter() - self.start, 3)
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")

    def on_batch_collected(self, batch):
        mean = float(self.experiment.mean_return)
        self.write(env_steps=int(self.experiment.total_frames), return_mean=None if math.isnan(mean) else mean)

    def on_evaluation_end(self, rollouts):
        returns = []
        group = next(iter(self.experiment.group_map))
        for rollout in rollouts:  # one greedy episode each, cut at its first done as the package's logger does
            done = rollout.get(("next", "done")).reshape(rollout.batch_size[0], -1).any(-1)
            end = int(done.nonzero()[0, 0]) + 1 if done.any() else rollout.batch_size[0]
            returns.append(float(rollout.get(("next", group, "reward"))[:end].sum(0).mean()))
        self.eval_return = sum(returns) / len(returns)
        self.write(env_steps=int(self.experiment.total_frames), eval_return_mean=self.eval_return)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["qmix", "vdn"], default="qmix")
    parser.add_argument("--task", default="navigation", help="a VMAS task BenchMARL names (balance, navigation, ...)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--frames", type=int, default=1_000_000, help="frames (world steps) to collect")
    parser.add_argument("--out", required=True, help="JSON-lines output file")
    cli = parser.parse_args()

    experiment_config = ExperimentConfig.get_from_yaml()
    experiment_config.max_n_frames = cli.frames
    experiment_config.render = False
    experiment_config.loggers = []
    experiment_config.create_json = True  # the package evaluates only when it has somewhere to write the result
    experiment_config.save_folder = tempfile.mkdtemp(prefix="benchmarl_")
    experiment_config.checkpoint_at_end = False
    task = VmasTask[cli.task.upper()].get_from_yaml()
    algorithm = (QmixConfig if cli.algo == "qmix" else VdnConfig).get_from_yaml()
    model = MlpConfig.get_from_yaml()

    os.makedirs(os.path.dirname(os.path.abspath(cli.out)), exist_ok=True)
    open(cli.out, "w").close()
    progress = JsonLines(cli.out)
    experiment = Experiment(
        task=task,
        algorithm_config=algorithm,
        model_config=model,
        critic_model_config=model,
        seed=cli.seed,
        config=experiment_config,
        callbacks=[progress],
    )
    experiment.run()
    progress.write(env_steps=int(experiment.total_frames), eval_return_mean=progress.eval_return, final=True)
    seconds = time.perf_counter() - progress.start
    print(f"{cli.algo} on vmas/{cli.task}: {experiment.total_frames} frames in {seconds:.1f} s")
    print("torch threads:", torch.get_num_threads())


if __name__ == "__main__":
    main()
