"""The population's role: one worker beside the first member's lead trainer while the run trains a population
(``population.members``). Every actor deals its envs to the members (:func:`slot`) and sends the worker each
member's env steps and returns (the episode tap: it serves an episode sink); the worker scores the members, and
tells a member's lead trainer to export its state or to import another's through the trainer's command port
(:func:`port`: each trainer's :class:`~srl.population.worker.MemberLink`), which answers to the worker's mailbox
(:data:`INBOX`)."""

from __future__ import annotations

from srl.api.config import ConfigError
from srl.api.env import GroupedSlot
from srl.api.plugins import resolve
from srl.api.worker import TrainerPort, Worker
from srl.population.rules import RULES
from srl.population.state import PopulationState
from srl.population.worker import MemberLink, PopulationWorker
from srl.runtime.build import BuildContext, env_slot
from srl.runtime.plan import Plan, PolicyPlan
from srl.runtime.topology import TRAINER_NODE, Endpoint, Report, Role, Stream, StreamKind, every_snapshot
from srl.wiring import algorithm_class, algorithm_settings, learns_on_policy

INBOX = StreamKind("population", "population{}", bound=True, mail=True)
"""The population worker's mailbox: the members' lead trainers' answers (an exported state, a copy taken)."""


def build(ctx: BuildContext) -> Worker:
    """The population worker: its state from the config (a restart reads its saved state back in ``setup``), the
    exploit rule the config names, the actors' episodes and each member's command channel."""
    plan, fabric, run_dir = ctx.plan, ctx.fabric, ctx.run_dir
    cfg = plan.cfg.population
    if run_dir is None:
        raise ConfigError("population: the population keeps its state and copies in the run directory; none here")
    rule = resolve(cfg.rule, RULES, "population.rule")(cfg)
    served = ctx.worker.service(Stream.EPISODES)
    assert served is not None
    bases = len(plan.cfg.base_policies)
    evaluate = None
    if cfg.score == "eval":  # each member's newest snapshot, read like the eval worker reads them
        from srl.evaluate import eval_seed, play_team

        policies, subscribers = ctx.subscribers()

        def evaluate(member: int) -> list[float]:
            """Its team (the members of its index) plays; its own agents' returns."""
            k, j = divmod(member, bases)
            team = range(k * bases, (k + 1) * bases)
            for i in team:
                subscribers[i].refresh()
            played = play_team(plan.cfg, [policies[i] for i in team], cfg.eval_episodes, eval_seed(plan.cfg))
            start = sum(plan.policies[i].agents_per_env for i in team[:j]) * cfg.eval_episodes
            mine = played["returns"][start : start + plan.policies[member].agents_per_env * cfg.eval_episodes]
            return [float(r) for r in mine]

    return PopulationWorker(
        PopulationState.start(cfg, plan.cfg.seed, bases),
        rule,
        fabric.channel(served),
        fabric.mailbox(Endpoint(INBOX, 0), read=True),
        [fabric.mailbox(e, read=False) for e in ctx.worker.connects if e.stream is Stream.COMMANDS],
        run_dir,
        ctx.reporter,
        plan.cfg.policy_names,
        wait_timeout=max(ctx.wait_timeout, 0.0),
        evaluate=evaluate,
    )


def check(plan: Plan) -> None:
    """What the population needs of the env, the algorithm and the layout: not a turn-based game; its searched
    keys in the algorithm's own section, among its ``live_settings`` where it names them, and a ``reconfigure`` to
    take them live; an interval of at least one update."""
    cfg = plan.cfg
    if plan.game_players:
        raise ConfigError(
            f"population: env {cfg.env.id!r} is a turn-based game, whose self-play returns cannot score a member "
            "(they average 0); a league ranks players of a game"
        )
    pop, cls = cfg.population, algorithm_class(cfg)
    section, live = getattr(cls, "section", None), getattr(cls, "live_settings", None)
    for i, h in enumerate(pop.hyperparameters):
        if h.section != section:
            reads = f"the {section} section" if section else "algorithm_args"
            raise ConfigError(f"population.hyperparameters[{i}].key: {h.key}: {cfg.algorithm} reads {reads}")
        if live is not None and h.field not in live:
            raise ConfigError(
                f"population.hyperparameters[{i}].key: {h.key}: {cfg.algorithm} takes only "
                f"{', '.join(sorted(live))} while it trains"
            )
    if pop.hyperparameters and not callable(getattr(cls, "reconfigure", None)):
        raise ConfigError(f"population.hyperparameters: {cfg.algorithm} takes no new settings while it trains")
    member = plan.policies[0]
    per_update = _env_steps_per_update(plan, member)
    if pop.interval < per_update:
        raise ConfigError(
            f"population.interval: {pop.interval} env steps is less than one update of a member ({per_update:,} env "
            "steps): it would be scored before it learned anything"
        )


def _env_steps_per_update(plan: Plan, member: PolicyPlan) -> int:
    """Env steps of one member behind one update of its trainers: its share of ``batch_segments`` segments per
    trainer, or with a replay its batch over ``samples_per_insert``."""
    w = plan.cfg.workers
    if learns_on_policy(plan.cfg):
        return w.trainers * w.batch_segments * w.segment_length * member.envs_per_slot
    batch = int(getattr(algorithm_settings(member.cfg), "batch_size", 1))
    return w.trainers * max(1, int(batch / plan.cfg.replay.samples_per_insert))


def port(ctx: BuildContext) -> TrainerPort:
    """A member's trainer's end of the population: the lead's with its command channel, the other data-parallel
    trainers' without (they take each copy with the lead, at their lockstep)."""
    plan, trainer, fabric = ctx.plan, ctx.worker, ctx.fabric
    served = trainer.service(Stream.COMMANDS)
    k = plan.policy_of_trainer(trainer.index)
    settings = lambda values: algorithm_settings(plan.policies[k].cfg.with_values(values))  # noqa: E731
    commands = None if served is None else fabric.mailbox(served, read=True)
    return MemberLink(commands, lambda: fabric.mailbox(Endpoint(INBOX, 0), read=False), k, settings)


def slot(ctx: BuildContext, i: int) -> GroupedSlot:
    """Actor slot ``i`` of a population run: its envs dealt to the members, each member's agents its columns."""
    return env_slot(ctx.plan, members=ctx.plan.cfg.policy_names)


POPULATION = Role(
    "population",
    count=lambda plan: int(plan.cfg.population.enabled),
    builder="srl.population.role:build",
    seed_salt=9,
    serves=lambda plan, i: (Endpoint(Stream.EPISODES, 0), Endpoint(INBOX, 0)),
    connects=lambda plan, i: (
        *(Endpoint(Stream.COMMANDS, k) for k in range(plan.policy_count)),
        *(every_snapshot(plan, TRAINER_NODE, i) if plan.cfg.population.score == "eval" else ()),
    ),
    report=Report("population", "srl.population.worker:PopulationReports"),
    port="srl.population.role:port",
    check="srl.population.role:check",
    slots="srl.population.role:slot",
)
