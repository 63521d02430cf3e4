"""Peer measurement: Sample Factory 2 on HalfCheetah with ``sf_examples``' MuJoCo defaults, env steps/s.

    python scripts/peers/sf_halfcheetah.py --seconds 90 --train-dir /tmp/sf   # in the venv that has sample-factory

Runs ``python -m sf_examples.mujoco.train_mujoco --env=mujoco_halfcheetah`` (HalfCheetah-v4) with nothing but
the experiment name, the train folder, ``--seed`` and ``--device=cpu`` set, so every other setting is
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
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    p.add_argument("--seconds", type=float, default=90.0, help="seconds of SF's reports measured (after --warmup)")
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
        f"--seed={args.seed}",
        "--restart_behavior=overwrite",
        "--device=cpu",  # SF's default is the GPU; this machine has none
    ]
    # SF's --train_for_seconds did not stop a synchronous run here, so the run is ended from outside once its
    # log (sf_log.txt in the experiment folder) holds enough reports: SIGTERM to its process group (its
    # workers included), then SIGKILL
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"sf_halfcheetah: signal {signum}"))  # finally runs
    log = Path(args.train_dir) / "halfcheetah_peer" / "sf_log.txt"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    lines: list[str] = []
    try:
        while proc.poll() is None:
            time.sleep(1.0)
            lines = log.read_text().splitlines() if log.exists() else []
            rows = [r for r in reports(lines) if r[1] > 0]
            if rows and rows[-1][0] - rows[0][0] >= args.warmup + args.seconds:
                break
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
    rows = [r for r in reports(lines) if r[1] > 0]
    if len(rows) < 3:
        sys.exit(
            f"sf_halfcheetah: fewer than 3 SF reports with frames (exit {proc.returncode}):\n{''.join(lines)[-2000:]}"
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
