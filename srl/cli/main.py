"""The ``srl`` command line: ``srl train CONFIG [--set key=value ...] [--run-dir DIR]``, ``srl train --resume RUN_DIR``,
``srl bench``, ``srl plot``, ``srl plan``."""

from __future__ import annotations

import time

START = time.time()
"""When the program started: its own clock at its first line, before any import of weight. Interpreter start-up
before it is not counted; the process table's start is not used, as a shell that execs ``srl`` as its last
command passes on its own start, and ``/proc/stat`` gives boot time in whole seconds."""

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from srl.base.stop_signals import listening  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="srl", description="SRL: scalable distributed reinforcement learning.")
    sub = p.add_subparsers(dest="command", required=True)
    from srl.api.config import FIXED_ON_RESUME
    from srl.cli import add_overrides

    t = sub.add_parser("train", help="train an experiment")
    t.add_argument("config", nargs="?", default=None, help="experiment YAML file (see configs/)")
    t.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint (with its config; --set overrides allowed except "
        f"{', '.join(FIXED_ON_RESUME)})",
    )
    add_overrides(t, "override a config field, e.g. --set ppo.lr=0.001 (repeatable)")
    t.add_argument(
        "--overlay",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML overlay (sections of an experiment file, e.g. what srl tune writes), applied before --set",
    )
    t.add_argument("--run-dir", type=Path, default=None, help="run directory (default: runs/<name>-<time>)")
    t.add_argument("--quiet", action="store_true", help="no progress line")
    e = sub.add_parser("eval", help="evaluate a run's newest checkpoint (or one checkpoint); optional MP4 video")
    e.add_argument("target", type=Path, help="run directory or checkpoint file")
    e.add_argument("--episodes", type=int, default=10, help="episodes, played at once (default 10)")
    e.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the most likely")
    e.add_argument(
        "--seed", type=int, default=None, help="environment seed (default: the run's evaluation seed, as in training)"
    )
    e.add_argument("--video", type=Path, default=None, metavar="PATH", help="write the first episode as MP4")
    e.add_argument(
        "--opponent",
        default=None,
        metavar="random|mcts:N|RUN_DIR",
        help="two-player turn-based games: play --episodes games against this opponent (seats alternate) and "
        "print win, draw and loss rates",
    )
    add_overrides(e, "change how the saved config acts, e.g. alphazero.search.simulations=128 (repeatable)")
    from srl.cli import bench, plan, plot, tune

    bench.add_parser(sub)
    plot.add_parser(sub)
    plan.add_parser(sub)
    tune.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. SIGINT and SIGTERM are handled from here on (:mod:`srl.base.stop_signals`):
    a run stops cleanly, anything else ends with 130."""
    with listening():
        try:
            return _command(argv)
        except KeyboardInterrupt:  # a signal outside a run, or a second one while workers were stopping
            print("srl: interrupted", file=sys.stderr)
            return 130


def _say_notices() -> None:
    """What reading a config changed on its own (a ``ConfigNotice``) is one line on stderr, ``srl: warning: ...``,
    where a command does not keep it for its run (``srl train`` does: it goes into the run's warnings)."""
    import warnings

    from srl.api.config import ConfigNotice

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, ConfigNotice):
            print(f"srl: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show


def _command(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    _say_notices()
    # Plugins named ``package.module:attr`` import from the current folder too, as under ``python -m``.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    from srl.api.config import ConfigError, load_config, notices

    try:
        if args.command == "train":
            from srl.api.config.load import overlay_overrides

            if (args.config is None) == (args.resume is None):
                raise ConfigError("srl train: give a CONFIG file or --resume RUN_DIR (one of them)")
            args.overrides = [o for f in args.overlay for o in overlay_overrides(f)] + args.overrides
            resume = None
            with notices() as notes:
                if args.resume is not None:
                    if args.run_dir is not None:
                        raise ConfigError("--run-dir: a resumed run continues in its own directory")
                    from srl.runtime.train import resume_config

                    cfg, resume = resume_config(args.resume, args.overrides)
                    args.run_dir = args.resume
                else:
                    cfg = load_config(args.config, args.overrides)
            from srl.runtime.train import train  # torch and the envs load after the config passed: errors come fast

            progress = None if args.quiet else sys.stderr
            summary = train(cfg, args.run_dir, START, progress=progress, resume=resume, notes=notes)
            print(json.dumps(summary))
            if summary.get("error"):
                print(f"srl: error: {summary['error']}", file=sys.stderr)
                return 1
            return 130 if summary["stop_reason"] == "interrupted" else 0
        if args.command == "eval":
            from srl.evaluate import eval_seed, play
            from srl.loaded import load_policies

            if args.episodes < 1:
                raise ConfigError(f"--episodes: must be >= 1, got {args.episodes}")
            cfg, policies, source = load_policies(args.target, args.overrides)
            seed = eval_seed(cfg) if args.seed is None else args.seed
            if args.opponent is not None:
                from srl.league.match import play_match

                if args.video is not None:
                    raise ConfigError("--video: not with --opponent")
                if len(policies) > 1:
                    raise ConfigError("--opponent: plays a run of one policy against another")
                match = play_match(cfg, policies[0], args.opponent, args.episodes, seed, not args.stochastic)
                print(json.dumps({**source, "opponent": args.opponent, **match.as_dict()}))
                return 0
            result = play(cfg, policies, args.episodes, seed, deterministic=not args.stochastic, video=args.video)
            print(json.dumps({**source, **result}))
            return 0
        if args.command == "bench":
            from srl.cli.bench import run_bench

            return run_bench(args)
        if args.command == "plot":
            from srl.cli.plot import run_plot

            return run_plot(args)
        if args.command == "plan":
            from srl.cli.plan import run_plan

            return run_plan(args)
        if args.command == "tune":
            from srl.cli.tune import run_tune

            return run_tune(args)
    except ConfigError as exc:
        print(f"srl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
