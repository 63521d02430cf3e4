"""The run's topology as data: roles, names, node groups, whom each worker serves and connects to, restarts."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest

from srl.api.config import ConfigError, load_config
from srl.api.worker import Worker
from srl.eval.role import EVAL
from srl.runtime.build import BuildContext, build_worker
from srl.runtime.fabric import InlineFabric
from srl.runtime.inline import run_inline
from srl.runtime.plan import Plan, make_plan
from srl.runtime.topology import (
    ACTOR,
    LOCAL_GROUP,
    PARAM_ROOT,
    POLICY,
    RELAY,
    ROLES,
    TRAINER,
    TRAINER_NODE,
    Endpoint,
    Hop,
    Restart,
    Role,
    Stream,
    StreamKind,
    Topology,
    held_by,
    topology_of,
    trainer_group,
)
from srl.system.controller import Controller
from srl.system.streams import READY, SAMPLE_WIDTH, STAGED, SegmentForwarder, SegmentSource

CARTPOLE = Path(__file__).resolve().parents[1] / "configs" / "cartpole_ppo.yaml"


def _plan(*overrides: str) -> Plan:
    return make_plan(load_config(CARTPOLE, list(overrides)))


def _names(workers) -> list[str]:
    return [w.name for w in workers]


def _samples(i: int) -> Endpoint:
    return Endpoint(Stream.SAMPLES, i)


def test_the_default_local_run_is_a_trainer_and_an_actor_that_infers_itself():
    topology = _plan().topology
    assert _names(topology.workers) == ["trainer0", "actor0"]
    trainer, actor = topology.workers
    assert trainer.role is TRAINER and actor.role is ACTOR and actor.index == 0
    assert {w.group for w in topology.workers} == {LOCAL_GROUP}
    assert actor.connects == (_samples(0), Endpoint(Stream.SNAPSHOTS))  # no policy worker: the trainer's buffer
    assert trainer.serves == (_samples(0), Endpoint(Stream.SNAPSHOTS))
    assert trainer.restart is Restart.FROM_CHECKPOINT and actor.restart is Restart.ALONE
    assert topology.clients_of(_samples(0)) == (actor,)
    assert topology.get("actor", 0) is topology.get(ACTOR, 0) is actor  # a JSON spec names the role


def test_a_local_run_with_trainers_policy_workers_relays_and_an_eval_worker():
    topology = _plan(
        "workers.trainers=2",
        "workers.actors=4",
        "workers.policy_workers=2",
        "params.groups=2",
        "run.eval_every_versions=3",
    ).topology
    assert _names(topology.workers) == [
        "trainer0",
        "trainer1",
        "param_root0",
        "relay0",
        "relay1",
        "policy0",
        "policy1",
        "actor0",
        "actor1",
        "actor2",
        "actor3",
        "eval0",
    ]  # start order: trainers publish first, servers before their clients
    assert {w.group for w in topology.workers} == {LOCAL_GROUP}
    assert _names(topology.clients_of(_samples(1))) == ["actor1", "actor3"]  # actor a feeds trainer a % 2
    assert _names(topology.clients_of(Endpoint(Stream.INFERENCE, 0))) == ["actor0", "actor2"]
    assert _names(topology.clients_of(Endpoint(Stream.PARAMS))) == ["relay0", "relay1"]
    # on one machine the readers are spread over the relays' buffers by index
    assert _names(topology.clients_of(Endpoint(Stream.SNAPSHOTS, 1))) == ["policy1"]
    assert topology.get(EVAL, 0).connects == (Endpoint(Stream.SNAPSHOTS, 0),)
    assert topology.get(PARAM_ROOT, 0).connects == (Endpoint(Stream.SNAPSHOTS),)  # serves the lead's buffer
    trainer1 = topology.get(TRAINER, 1)
    assert _names(topology.peers(trainer1)) == ["trainer0", "trainer1"]  # data-parallel: restart together
    assert _names(topology.peers(topology.get(RELAY, 1))) == ["relay1"]
    assert [w.restart for w in topology.workers if w.role is not TRAINER] == [Restart.ALONE] * 10


def test_ray_node_groups_and_the_relay_tree():
    """Four actor nodes of two actors, one policy worker each, two trainers, relays in a tree of fan-out 2."""
    plan = _plan(
        "runtime=ray",
        "ray.actor_nodes=4",
        "ray.actors_per_node=2",
        "ray.policy_workers_per_node=1",
        "workers.trainers=2",
        "ray.trainer_nodes=2",
        "params.fan_out=2",
        "run.eval_every_versions=2",
    )
    topology = plan.topology
    group = {w.name: w.group for w in topology.workers}
    assert group["trainer0"] == TRAINER_NODE and group["trainer1"] == trainer_group(1) == -2
    assert group["param_root0"] == group["eval0"] == TRAINER_NODE  # with the lead trainer
    for g in range(4):
        assert _names(topology.in_group(g)) == [f"relay{g}", f"policy{g}", f"actor{2 * g}", f"actor{2 * g + 1}"]
    assert topology.groups == (-1, -2, 0, 1, 2, 3)
    assert _names(topology.clients_of(_samples(0))) == ["actor0", "actor2", "actor4", "actor6"]
    assert _names(topology.clients_of(Endpoint(Stream.PARAMS))) == ["relay0", "relay1"]  # relays 2, 3 hang below
    assert _names(topology.clients_of(Endpoint(Stream.PARAMS, 0))) == ["relay2", "relay3"]
    assert topology.clients_of(Endpoint(Stream.PARAMS, 1)) == () == topology.clients_of(Endpoint(Stream.PARAMS, 3))
    # a relay binds a socket only when relays hang below it; every reader reads its own node's buffer
    assert topology.get(RELAY, 0).service(Stream.PARAMS) == Endpoint(Stream.PARAMS, 0)
    assert topology.get(RELAY, 1).service(Stream.PARAMS) is None
    assert all(topology.get(POLICY, g).connects == (Endpoint(Stream.SNAPSHOTS, g),) for g in range(4))
    assert topology.get(EVAL, 0).connects == (Endpoint(Stream.SNAPSHOTS),)  # the trainers' node has no relay
    # resources: what each group claims under Ray
    r = plan.cfg.ray
    assert sum(w.cpus for w in topology.in_group(0)) == 2 * r.cpus_per_actor + r.cpus_per_policy_worker


def test_ray_flat_parameters_and_actors_that_infer_themselves():
    flat = _plan(
        "runtime=ray",
        "ray.actor_nodes=4",
        "ray.actors_per_node=2",
        "ray.policy_workers_per_node=1",
        "params.mode=flat",
        "run.eval_every_versions=5",
    ).topology
    assert not flat.of(RELAY)
    assert _names(flat.clients_of(Endpoint(Stream.PARAMS))) == [f"policy{i}" for i in range(4)] + ["eval0"]
    inline = _plan(
        "runtime=ray", "ray.actor_nodes=4", "ray.actors_per_node=2", "ray.policy_workers_per_node=0", "params.mode=flat"
    ).topology
    assert _names(inline.clients_of(Endpoint(Stream.PARAMS))) == [f"actor{a}" for a in range(8)]


def test_a_populations_members_are_dealt_over_the_trainer_groups_with_their_roots():
    """Under Ray, member k trains whole in trainer group k mod trainer_nodes, its parameter root beside its lead's
    buffer; readers in the first group (eval, the population worker) read the other members from their roots; the
    population's episodes and member commands are bound record channels (sockets across nodes); no data-parallel
    store (no policy spans two groups)."""
    pbt = Path(__file__).resolve().parents[1] / "configs" / "cartpole_pbt.yaml"
    sets = ["runtime=ray", "ray.actor_nodes=2", "ray.trainer_nodes=2", "workers.actors=2", "params.groups=2"]
    plan = make_plan(
        load_config(pbt, [*sets, "params.mode=hierarchical", "run.eval_every_versions=5", "population.score=eval"])
    )
    topology = plan.topology
    group = {w.name: w.group for w in topology.workers}
    assert [group[f"trainer{k}"] for k in range(4)] == [-1, -2, -1, -2] and plan.policy_nodes == 1
    assert [group[f"param_root{k}"] for k in range(4)] == [-1, -2, -1, -2]
    assert group["population0"] == group["eval0"] == TRAINER_NODE
    reads = (Endpoint(Stream.SNAPSHOTS), Endpoint(Stream.PARAMS, policy=1))
    reads += (Endpoint(Stream.SNAPSHOTS, policy=2), Endpoint(Stream.PARAMS, policy=3))
    assert topology.get(EVAL, 0).connects == reads
    population = topology.get("population", 0)
    assert population.connects == tuple(Endpoint(Stream.COMMANDS, k) for k in range(4)) + reads
    assert Stream.EPISODES.bound and Stream.COMMANDS.bound
    assert _names(topology.clients_of(Endpoint(Stream.EPISODES, 0))) == ["actor0", "actor1"]
    assert topology.get(TRAINER, 1).service(Stream.COMMANDS) == Endpoint(Stream.COMMANDS, 1)
    with pytest.raises(ConfigError, match=r"^ray.trainer_nodes: 5 trainer node groups for 4 population members"):
        load_config(pbt, ["runtime=ray", "ray.trainer_nodes=5"])


def test_every_builtin_role_names_a_builder_and_a_distinct_seed():
    import importlib

    from srl.api.plugins import resolve
    from srl.wiring import PATH_ROLES
    from srl.wiring import ROLES as PACKAGED

    packaged = [resolve(name, {}, "role", callable_=False) for name in (*PACKAGED.values(), *PATH_ROLES.values())]
    every = (*ROLES, *packaged)
    assert [r.name for r in packaged] == [*PACKAGED, *PATH_ROLES]
    for role in every:
        hooks = (role.builder, role.report and role.report.aggregator, role.port, role.slots, role.resumed, role.check)
        for hook in hooks:
            if hook is not None:
                module, _, attr = hook.partition(":")
                assert callable(getattr(importlib.import_module(module), attr)), (role.name, hook)
    assert len({role.seed_salt for role in every}) == len(every)
    assert len({role.name for role in every}) == len(every)


# --------------------------------------------------------------------------- a role declared outside the core
class _Counter(Worker):
    """A worker of a role the core does not know: it counts its polls."""

    def __init__(self, name: str) -> None:
        self.name, self.polls = name, 0

    def poll(self) -> int:
        self.polls += 1
        return 0


def build_counter(ctx: BuildContext) -> Worker:
    return _Counter(ctx.worker.name)


COUNTER = Role(
    "counter",
    count=lambda plan: 2,
    builder=f"{__name__}:build_counter",
    seed_salt=99,
    connects=lambda plan, i: (Endpoint(Stream.SAMPLES, 0),),
)


def test_a_new_role_is_its_worker_class_plus_one_declaration():
    plan = _plan()
    topology: Topology = topology_of(plan, (*ROLES, COUNTER))
    assert _names(topology.workers) == ["trainer0", "actor0", "counter0", "counter1"]
    assert _names(topology.clients_of(_samples(0))) == ["actor0", "counter0", "counter1"]
    fabric = InlineFabric(plan, lambda kind, meta, arrays: None)
    worker = build_worker(plan, fabric, topology.get(COUNTER, 1), None, wait_timeout=0.0, report_interval=0.0)
    assert isinstance(worker, _Counter) and worker.name == "counter1"


# --------------------------------------------------------------------------- a plugin's role on the sample path
TAPS: list[_Tap] = []


class _Tap(Worker):
    """A plugin's hop between the actors and the trainer: it counts every segment and passes it on unchanged."""

    def __init__(self, name: str, source: SegmentSource, forwarder: SegmentForwarder) -> None:
        self.name, self.source, self.forwarder, self.seen = name, source, forwarder, 0

    def poll(self) -> int:
        records = self.source.receive(64, 0.0)
        for actor, buf in records.tolist():
            self.forwarder.forward(actor, buf)
        self.seen += len(records)
        return len(records)


def build_tap(ctx: BuildContext) -> Worker:
    tap = _Tap(ctx.worker.name, ctx.fabric.segment_source(ctx.worker), ctx.fabric.segment_forwarder(ctx.worker))
    TAPS.append(tap)
    return tap


TAP = Role(
    "tap",
    count=lambda plan: 1,
    builder=f"{__name__}:build_tap",
    seed_salt=98,
    hop=Hop(StreamKind("tap", "tap{}", channel=SAMPLE_WIDTH, segments=True), route=lambda plan, actor, policy: 0),
)


def test_a_plugin_role_joins_the_sample_path_from_the_config_without_editing_srl():
    """``workers.path`` names a role declared here: the actors submit to it, it hands every segment on to the
    trainer, and the run trains; its buffers are what the path hands it."""
    plan = _plan("runtime=inline", "workers.actors=2", f"workers.path=[{__name__}:TAP]")
    assert plan.sample_path == (TAP,)
    topology = plan.topology
    assert _names(topology.workers) == ["trainer0", "tap0", "actor0", "actor1"]  # the hop starts before its actors
    assert topology.get(ACTOR, 1).connects[0] == Endpoint(TAP.hop.stream, 0)  # type: ignore[union-attr]
    assert topology.get(TAP, 0).connects == (_samples(0),)
    assert held_by(plan, topology.get(TAP, 0)) == {(0, 0): (STAGED,), (0, 1): (STAGED,)}
    assert held_by(plan, topology.get(TRAINER, 0)) == {(0, 0): (READY,), (0, 1): (READY,)}
    TAPS.clear()
    cfg = load_config(CARTPOLE, ["runtime=inline", "workers.actors=2", f"workers.path=[{__name__}:TAP]"])
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, total_env_steps=6_000, target_return=None))
    controller = Controller(cfg, None, time.time(), progress=None)
    run_inline(make_plan(cfg), controller, None)
    assert controller.error is None
    [tap] = TAPS
    segment = cfg.workers.segment_length * cfg.workers.envs_per_slot
    assert controller.policy_version >= 1 and tap.seen * segment >= int(controller.record()["samples"]) > 0


def test_the_path_names_only_roles_of_the_sample_path_each_once():
    for path, said in [
        ("[nowhere]", "workers.path: 'nowhere' is neither a built-in name"),
        (f"[{__name__}:COUNTER]", "is not a role of the sample path"),
        (f"[{__name__}:TAP, {__name__}:TAP]", "is listed twice"),
        ("[replay]", "a replay serves algorithms that learn off-policy; ppo learns from on-policy segments"),
        ("[stage]", "has stage, but stage.worker names no class"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            _plan(f"workers.path={path}")


PORTED = Role(
    "ported",
    count=lambda plan: 1,
    builder=f"{__name__}:build_counter",
    seed_salt=98,
    port=f"{__name__}:build_counter",
)


def test_two_roles_that_each_reach_into_the_trainers_are_one_line():
    """A trainer takes one role's port: a plugin's beside a population's is refused before anything starts."""
    cfg = load_config("configs/cartpole_pbt.yaml", [f"workers.roles=[{__name__}:PORTED]"])
    with pytest.raises(ConfigError, match=r"^workers.roles: roles population, ported each declare a port"):
        make_plan(cfg)
