"""Peer baseline: QMIX or VDN from PyMARLzoo+ (EPyMARL's algorithms) on LBF or RWARE.

It runs in its own venv and is not part of srl. The package's own requirements pull another torch and many
optional envs, so it is installed without them, with what QMIX and VDN on LBF and RWARE import:

    python3.11 -m venv VENV && VENV/bin/pip install torch==2.13.0
    VENV/bin/pip install --no-deps 'pymarlzooplus==1.1.*'
    VENV/bin/pip install 'numpy<2' pyyaml sacred rich gymnasium lbforaging==2.0.0 rware==2.0.0 'setuptools<81' \\
        opencv-python-headless==4.11.0.86 seaborn matplotlib pandas scikit-learn pyglet==1.5.27

Usage:
    VENV/bin/python scripts/peers/pymarlzooplus_qmix.py --algo qmix \\
        --env lbforaging:Foraging-8x8-2p-2f-coop-v3 --seed 0 --t-max 20000 --out runs/peers/pmz_qmix_lbf_s0.jsonl

The settings are the package's own. The script reads config/default.yaml, then config/envs/gymma.yaml,
then config/algs/<algo>.yaml from the installed package and merges them in that order, as pymarlzooplus.main does.
On top it sets only what the package's README sets for these tasks: env_args.key, env_args.time_limit
(50 for LBF, 500 for RWARE) and the seed, plus t_max from --t-max.
--test-interval and --log-interval change only how often it tests and logs (the defaults are the package's).

The package's entry point pymarlzooplus() always writes sacred files next to the calling script,
draws plots and sleeps 10 s at the end. So this script calls pymarlzooplus.run.run_sequential itself,
with the package's Logger, and sacred, tensorboard, wandb and model saving stay off. Nothing reaches the network.

Output: one JSON line per log point of the package (a training log every runner_log_interval env steps,
a test after every test_interval), and a last line with "final": true.
Each line has env_steps (training env steps; test episodes are not counted), wall_seconds (since the run was set up,
test episodes included), return_mean (mean team return of the training episodes since the previous training log)
and test_return_mean on test lines (greedy policy, test_nepisode episodes).
The team return is the sum of all agents' rewards: the package's gym wrapper sums the agents' rewards every step.
"""

import argparse
import json
import os
import time
from types import SimpleNamespace

import numpy as np
import pymarlzooplus
import torch
import yaml
from pymarlzooplus.main import recursive_dict_update
from pymarlzooplus.run import args_sanity_check, run_sequential
from pymarlzooplus.runners import REGISTRY as RUNNERS
from pymarlzooplus.utils.logging_setup import Logger, get_logger

CONFIG_DIR = os.path.join(os.path.dirname(pymarlzooplus.__file__), "config")
TIME_LIMITS = {"lbforaging": 50, "rware": 500}  # from the package README's LBF and RWARE examples


def load_yaml(*parts):
    with open(os.path.join(CONFIG_DIR, *parts)) as f:
        return yaml.safe_load(f)


def build_config(algo, env_key, seed, t_max):
    config = load_yaml("default.yaml")
    config = recursive_dict_update(config, load_yaml("envs", "gymma.yaml"))
    config = recursive_dict_update(config, load_yaml("algs", f"{algo}.yaml"))
    time_limit = TIME_LIMITS[env_key.split(":")[0]]
    config["env_args"].update(key=env_key, time_limit=time_limit, seed=seed)
    config.update(seed=seed, t_max=t_max)
    return config


class JsonLinesLogger(Logger):
    """The package's Logger, which also writes return_mean and test_return_mean to a JSON-lines file."""

    def __init__(self, console_logger, out):
        super().__init__(console_logger)
        self.out = out
        self.start = time.perf_counter()
        self.last_return = None

    def write(self, **line):
        line["wall_seconds"] = round(time.perf_counter() - self.start, 3)
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    def log_stat(self, key, value, t, to_sacred=True):
        super().log_stat(key, value, t, to_sacred)
        if key == "return_mean":
            self.last_return = float(value)
            self.write(env_steps=int(t), return_mean=self.last_return)
        elif key == "test_return_mean":
            self.write(env_steps=int(t), return_mean=self.last_return, test_return_mean=float(value))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["qmix", "vdn"], default="qmix")
    parser.add_argument(
        "--env",
        default="lbforaging:Foraging-8x8-2p-2f-coop-v3",
        help="gym key: lbforaging:Foraging-8x8-2p-2f-coop-v3 or rware:rware-tiny-2ag-v2",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--t-max", type=int, default=20000, help="training env steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--test-interval", type=int, help="env steps between tests (package: 50000)")
    parser.add_argument("--log-interval", type=int, help="env steps between training logs (package: 10000)")
    parser.add_argument("--out", required=True, help="JSON-lines output file")
    cli = parser.parse_args()

    torch.set_num_threads(cli.threads)
    np.random.seed(cli.seed)  # as pymarlzooplus.main.my_main does
    torch.manual_seed(cli.seed)

    config = build_config(cli.algo, cli.env, cli.seed, cli.t_max)
    if cli.test_interval:
        config["test_interval"] = cli.test_interval
    if cli.log_interval:
        config.update(runner_log_interval=cli.log_interval, learner_log_interval=cli.log_interval)
    console = get_logger()
    config = args_sanity_check(config, console)
    args = SimpleNamespace(**config, device="cpu", device_cnn_modules="cpu", results_path="")

    runners = []
    base = RUNNERS[args.runner]

    class Runner(base):  # the package's runner, kept at hand to read its env step count at the end
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            runners.append(self)

    RUNNERS[args.runner] = Runner

    os.makedirs(os.path.dirname(os.path.abspath(cli.out)), exist_ok=True)
    with open(cli.out, "w") as out:
        logger = JsonLinesLogger(console, out)
        run_sequential(args=args, logger=logger)
        runner = runners[0]
        tail = float(np.mean(runner.train_returns)) if runner.train_returns else logger.last_return
        logger.write(env_steps=runner.t_env, return_mean=tail, final=True)
    console.info(
        "%s on %s: %d env steps in %.1f s", cli.algo, cli.env, runner.t_env, time.perf_counter() - logger.start
    )


if __name__ == "__main__":
    main()
