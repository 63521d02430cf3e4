"""Peer measurement: Sample Factory 2 on HalfCheetah with ``sf_examples``' MuJoCo defaults, env steps/s.

    python scripts/peers/sf_halfcheetah.py --seconds 90 --train-dir /tmp/sf   # in the venv that has sample-factory

Runs ``python -m sf_examples.mujoco.train_mujoco --env=mujoco_halfcheetah`` (HalfCheetah-v4) with nothing but
the experiment name, the train folder, ``--train_for_seconds`` and ``--seed`` set, so every other setting is
``sf_examples/mujoco/mujoco_params.py``'s (8 workers x 8 envs, rollout 64, batch 1024, 2 epochs x 4 batches,
64x64 tanh MLPs, normalized inputs and returns, synchronous PPO). It reads SF's own periodic report lines
("Fps is ... Total num frames: N ... Samples: M"), each stamped by SF's logger, and prints one JSON line:
{"peer": "sample-factory", "version": ..., "env_steps_per_second": ..., "samples_per_second": ..., ...}.

The rates are slopes between the first report after ``--warmup`` seconds of reports and the last one, so
start-up (spawning workers, building envs and the model) is not counted, as srl's ``train_fps`` counts from its
first env step. ``Total num frames`` counts env steps (MuJoCo's frameskip is 1); ``Samples`` counts the
samples the learner trained on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys

REPORT = re.compile(
    r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\].*Fps is .*Total num frames: (?P<frames>\d+)\."
    r".*Samples: (?P<samples>\d+)\."
)


def reports(lines: list[str]) -> list[tuple[float, int, int]]:
    """(seconds, env steps, samples trained) of every SF report line."""
    out = []
    for line in lines:
        m = REPORT.search(line)
        if m:
            t = dt.datetime.strptime(m["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((t, int(m["frames"]), int(m["samples"])))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=90, help="SF's --train_for_seconds")
    p.add_argument("--warmup", type=float, default=15.0, help="seconds of reports not counted")
    p.add_argument("--train-dir", required=True)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    cmd = [
        sys.executable,
        "-m",
        "sf_examples.mujoco.train_mujoco",
        "--env=mujoco_halfcheetah",
        "--experiment=halfcheetah_peer",
        f"--train_dir={args.train_dir}",
        f"--train_for_seconds={args.seconds}",
        f"--seed={args.seed}",
        "--restart_behavior=overwrite",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rows = reports((proc.stdout + proc.stderr).splitlines())
    rows = [r for r in rows if r[1] > 0]
    if len(rows) < 3:
        sys.exit(
            f"sf_halfcheetah: fewer than 3 SF reports with frames (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    t_first = rows[0][0]
    rows = [r for r in rows if r[0] - t_first >= args.warmup] or rows
    (t0, f0, s0), (t1, f1, s1) = rows[0], rows[-1]
    from importlib.metadata import version

    print(
        json.dumps(
            {
                "peer": "sample-factory",
                "version": version("sample-factory"),
                "env": "HalfCheetah-v4",
                "seconds": round(t1 - t0, 1),
                "env_steps": f1 - f0,
                "env_steps_per_second": round((f1 - f0) / (t1 - t0), 1),
                "samples_per_second": round((s1 - s0) / (t1 - t0), 1),
                "total_env_steps": f1,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
