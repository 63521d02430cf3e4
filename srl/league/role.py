"""The league's role: one worker beside the lead trainer while the learner plays a pool of its past selves
(``league.opponent``), keeping the pool and its ratings in ``RUN_DIR/league``; every actor's slot seats pool
members in the other seats of each game (:func:`slot`)."""

from __future__ import annotations

from pathlib import Path

from srl.api.config import ConfigError
from srl.api.env import GroupedSlot, OneGroup
from srl.api.worker import Worker
from srl.envs.slots import make_slot
from srl.envs.turns import TurnSlot
from srl.league.match import check_bots, match_slot, opponent, play_games
from srl.league.slot import LeagueSlot
from srl.league.worker import LeagueWorker
from srl.runtime.build import BuildContext
from srl.runtime.plan import Plan
from srl.runtime.topology import TRAINER_NODE, Report, Role, snapshot_endpoint
from srl.system.params import ParamSubscriber


def folder(run_dir: Path | None) -> Path:
    """Where the league keeps its pool: ``RUN_DIR/league``."""
    if run_dir is None:
        raise ConfigError("league.opponent: a league keeps its pool in the run directory; this run has none")
    return run_dir / "league"


def build(ctx: BuildContext) -> Worker:
    """The league worker reads snapshots like the eval worker and keeps the pool in ``RUN_DIR/league``."""
    plan = ctx.plan
    cfg, learning = plan.cfg, plan.only("a league")
    learner = learning.acting_policy()
    slot = match_slot(cfg, cfg.league.match_games, "league.opponent")
    seed = ctx.seed
    bots = {
        b.name: opponent(b.opponent, slot, seed + 11 * i, "league.bots", False) for i, b in enumerate(cfg.league.bots)
    }
    return LeagueWorker(
        cfg.league,
        learner,
        ParamSubscriber(ctx.snapshots(), learner),
        folder(ctx.run_dir),
        learning.acting_policy,
        lambda policy, other: play_games(slot, policy, other, seed, deterministic=False),
        ctx.reporter,
        seed,
        wait_timeout=max(ctx.wait_timeout, 0.0),
        bots=bots,
    )


def slot(ctx: BuildContext, i: int) -> GroupedSlot:
    """Actor slot ``i`` of a league run: the learner holds one seat of each game, pool members play the others."""
    cfg = ctx.plan.cfg
    turns = make_slot(cfg.env, cfg.workers.envs_per_slot)
    assert isinstance(turns, TurnSlot)
    learning = ctx.plan.only("a league")
    league = LeagueSlot(turns, folder(ctx.run_dir), cfg.league, learning.acting_policy, ctx.seed + i * 31)
    return OneGroup(league, learning.name)


def check(plan: Plan) -> None:
    """A pool of opponents needs a turn-based game of two or more players; each of ``league.bots`` is built once
    against it (a wrong one is one line naming it)."""
    cfg = plan.cfg
    if plan.game_players < 2:
        raise ConfigError(
            f"league.opponent: {cfg.league.opponent}: env {cfg.env.id!r} is not a turn-based game of two or more "
            "players"
        )
    check_bots(cfg)


LEAGUE = Role(
    "league",
    count=lambda plan: int(plan.cfg.league.pool),
    builder="srl.league.role:build",
    seed_salt=7,
    connects=lambda plan, i: (snapshot_endpoint(plan, TRAINER_NODE, i),),
    report=Report("league", "srl.league.worker:LeagueReports"),
    slots="srl.league.role:slot",
    check="srl.league.role:check",
)
