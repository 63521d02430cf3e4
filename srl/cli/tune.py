"""``srl tune CONFIG --seconds S``: try the layouts the capacity model ranks first, keep the fastest measured
(``--rank energy``: the one of least energy per sample trained).

    srl tune CONFIG [--seconds S] [--tries N] [--rank speed|energy] [--set key=value ...] [--out FILE] [--json]

What it tries and why is in :mod:`srl.tune`.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from srl.api.config import ConfigError
from srl.cli import add_overrides


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tune", help="measure the layouts the capacity model ranks first here; keep the fastest")
    p.add_argument("config", help="experiment YAML")
    p.add_argument(
        "--seconds",
        type=float,
        default=120.0,
        help="training time for the whole search, each try's start-up on top (default 120)",
    )
    p.add_argument("--tries", type=int, default=3, help="model-ranked layouts to train beside the config's own")
    p.add_argument(
        "--rank",
        choices=("speed", "energy"),
        default="speed",
        help="keep the layout that trains the most samples per second (speed) or spends the least energy per "
        "sample trained (energy: the least to a target, as a layout does not change what an update learns)",
    )
    add_overrides(p)
    p.add_argument("--out", type=Path, default=None, help="write the winning keys as a YAML overlay here")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_tune(args: argparse.Namespace) -> int:
    from srl.tune import tune, write_overlay

    if not (math.isfinite(args.seconds) and args.seconds > 0):
        raise ConfigError(f"--seconds: must be > 0, got {args.seconds}")
    result = tune(args.config, args.seconds, args.overrides, args.tries, rank=args.rank)
    if args.out is not None:
        write_overlay(args.out, result["best"])
        result["overlay"] = str(args.out)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"srl tune: {args.config} on {result['cores']} cores, {len(result['tried'])} of {result['grid_size']} "
          f"layouts trained for {result['seconds_per_try']:g} s each")  # fmt: skip
    energy = "/".join(sorted(set(result["energy_method"].values())))
    for t in sorted(result["tried"], key=lambda t: -t["trained_samples_per_second"]):
        mark = " (the config's own)" if t["own"] else ""
        joules = t["joules_per_trained_sample"]
        per_k = "-" if joules is None else f"{joules * 1e3:,.3g}"
        print(f"  {t['trained_samples_per_second']:>10,.0f} samples/s trained ({t['train_fps']:,.0f} env steps/s "
              f"sampled, {per_k} J per 1k samples, {energy}), {t['predicted_steps_per_second']:,.0f} predicted "
              f"(model rank {t['model_rank']}): {' '.join(t['set'])}{mark}")  # fmt: skip
    print("best: " + " ".join(f"--set {s}" for s in result["best"]))
    if args.out is not None:
        print(f"overlay: {args.out} (srl train {args.config} --overlay {args.out})")
    return 0
