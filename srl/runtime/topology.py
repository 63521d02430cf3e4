"""The run's topology as data: one typed record per worker, computed once from the plan.

Why: worker roles used to be bare strings built as ``f"{role}{index}"`` and
parsed back wherever a runtime, a fabric or a supervisor needed to know what
a worker is, whom it feeds and how it restarts; each place re-derived the
wiring (``a % trainers``, the relay tree, node groups) on its own. Here the
wiring is written once (Sample Factory's ``connect_components`` is the model):
each role is one :class:`Role` declaration, each worker one frozen
:class:`WorkerSpec` computed from it, and building, both fabrics, both
runtimes and the supervisor only query the :class:`Topology`.

A role is its declaration (compared by identity), not a member of a closed
``enum.Enum``: a plugin must be able to declare a role (e.g. a worker between
actors and trainers that filters segments) without editing this module. What
the core branches on is closed and typed as enums: the kinds of stream
(:class:`Stream`) and the restart policies (:class:`Restart`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from srl.system.param_service import relay_parent

if TYPE_CHECKING:
    from srl.runtime.plan import Plan

TRAINER_NODE = -1
"""Node group of the first trainer node: the lead trainer, the root parameter server, the eval worker.
Trainer node ``k`` is :func:`trainer_group` ``(k)``; actor nodes are 0, 1, ... Outside Ray every worker is in
:data:`LOCAL_GROUP`."""
LOCAL_GROUP = 0
"""The one node group of a run on one machine (``inline`` and ``local``)."""


def trainer_group(k: int) -> int:
    """Node-group index of trainer node ``k`` (``TRAINER_NODE``, -2, -3, ...)."""
    return TRAINER_NODE - k


class Stream(Enum):
    """The kinds of endpoint a worker serves or connects to."""

    SAMPLES = "samples"
    """Trainer ``i``'s sample stream (actors -> trainer)."""
    INFERENCE = "inference"
    """Policy worker ``p``'s request stream (actors -> policy worker, answered in place)."""
    PARAMS = "params"
    """A parameter server's socket: the root (index None) or relay ``g``."""
    SNAPSHOTS = "snapshots"
    """A node-local snapshot buffer: the lead trainer's (index None) or the one relay ``g`` mirrors into."""
    STAGE = "stage"
    """Stage worker ``s``'s stream of submitted segments (actors -> stage, in its node's pool)."""

    @property
    def bound(self) -> bool:
        """Its server binds an address when it starts (a socket; under Ray also the sample stream), which clients
        connect to: servers start before their clients, and clients follow a server that comes back elsewhere.
        The other kinds are node-local names that the node's fabric creates."""
        return self in (Stream.SAMPLES, Stream.PARAMS)


_ENDPOINT_NAMES = {
    Stream.SAMPLES: ("trainer{}", None),
    Stream.INFERENCE: ("policy{}", None),
    Stream.PARAMS: ("relay{}", "root"),
    Stream.SNAPSHOTS: ("params{}", "params"),
    Stream.STAGE: ("stage{}", None),
}


@dataclass(frozen=True)
class Endpoint:
    """One stream endpoint of the run: a stream kind and which one of it."""

    stream: Stream
    index: int | None = None
    """Which one (a trainer, a policy worker, a relay group); None for the root / the lead trainer's buffer."""
    policy: int = 0
    """Whose parameters a parameter endpoint carries (an index into the plan's policies)."""

    @property
    def name(self) -> str:
        """Its key in endpoint tables, pipe and socket names: ``trainer0``, ``policy1``, ``root``, ``relay2``,
        ``params``, ``params3``, and for the parameters of policy ``k`` > 0 ``root_p1``, ``params3_p1``.
        Produced from the record; nothing parses it back."""
        indexed, single = _ENDPOINT_NAMES[self.stream]
        if self.index is None:
            assert single is not None, f"{self.stream} endpoints are indexed"
            name = single
        else:
            name = indexed.format(self.index)
        return f"{name}_p{self.policy}" if self.policy else name


class Restart(Enum):
    """What the supervisor does when a worker dies (always bounded by ``workers.max_restarts`` per worker)."""

    ALONE = "alone"
    """Start it again by itself in its node group; the pool buffers it held are freed (their segments counted
    as dropped) first."""
    FROM_CHECKPOINT = "from_checkpoint"
    """Start it again together with every worker of its role (data-parallel peers cannot go on without it), from
    the newest checkpoint, publishing above every version readers hold. Needs a run directory."""


Rule = Callable[["Plan", int], "tuple[Endpoint, ...]"]


def _none(plan: Plan, index: int) -> tuple[Endpoint, ...]:
    return ()


def _no_resources(plan: Plan) -> float:
    return 0.0


@dataclass(frozen=True, eq=False)
class Role:
    """The declaration of one worker role: everything the core needs to place, wire, build and restart its
    workers. A new role is its worker class plus one of these."""

    name: str
    """Worker names are ``name`` + index (``actor0``): in ``workers.json``, metrics, ``restarts``, log lines."""
    count: Callable[[Plan], int]
    """How many workers of this role the run has."""
    builder: str
    """``module:attr`` of the function that builds one worker from a :class:`~srl.runtime.build.BuildContext`
    (by name, the way a plugin names its own, so that this table needs nothing from the builders)."""
    seed_salt: int
    """Distinct per role: separates its workers' random streams from other roles' (see ``worker_seed``)."""
    group: Callable[[Plan, int], int] = lambda plan, index: TRAINER_NODE
    """Under Ray: the node group worker ``index`` is placed in (by default with the lead trainer)."""
    serves: Rule = _none
    """The endpoints worker ``index`` serves."""
    connects: Rule = _none
    """The endpoints worker ``index`` connects to."""
    restart: Restart = Restart.ALONE
    """What the supervisor does when one of its workers dies."""
    cpus: Callable[[Plan], float] = _no_resources
    """CPUs each worker claims (placement only; Ray)."""
    gpus: Callable[[Plan], float] = _no_resources
    """GPUs each worker claims (Ray)."""
    policy: Callable[[Plan, int], int | None] = lambda plan, index: None
    """The policy worker ``index`` serves alone (trainers, parameter servers), or None (it serves them all)."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker of the run: its role, index, node group, endpoints and restart policy."""

    role: Role
    index: int
    group: int
    """Node group: the placement group under Ray; :data:`LOCAL_GROUP` on one machine."""
    serves: tuple[Endpoint, ...]
    connects: tuple[Endpoint, ...]
    restart: Restart
    cpus: float = 0.0
    gpus: float = 0.0
    policy: int | None = None
    """The policy it serves alone (an index into the plan's policies), or None."""

    @property
    def name(self) -> str:
        return f"{self.role.name}{self.index}"

    def service(self, stream: Stream) -> Endpoint | None:
        """The endpoint of kind ``stream`` this worker serves, if any."""
        return next((e for e in self.serves if e.stream is stream), None)

    def connection(self, stream: Stream, policy: int = 0) -> Endpoint | None:
        """The endpoint of kind ``stream`` (for parameters: of policy ``policy``) this worker connects to, if any."""
        params = stream in (Stream.PARAMS, Stream.SNAPSHOTS)
        return next((e for e in self.connects if e.stream is stream and (not params or e.policy == policy)), None)


@dataclass(frozen=True)
class Topology:
    """Every worker of the run, in start order (servers before their clients; trainers publish first)."""

    workers: tuple[WorkerSpec, ...]
    _by_key: dict[tuple[str, int], WorkerSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {(w.role.name, w.index): w for w in self.workers})

    def get(self, role: Role | str, index: int) -> WorkerSpec:
        """Worker ``index`` of ``role`` (a declaration, or its name as carried by a JSON spec)."""
        return self._by_key[(role if isinstance(role, str) else role.name, index)]

    def of(self, role: Role) -> tuple[WorkerSpec, ...]:
        """The workers of ``role``, by index."""
        return tuple(w for w in self.workers if w.role is role)

    def clients_of(self, endpoint: Endpoint) -> tuple[WorkerSpec, ...]:
        """The workers that connect to ``endpoint``: when its server comes back at another address, they must
        start again to follow it."""
        return tuple(w for w in self.workers if endpoint in w.connects)

    def endpoints(self, stream: Stream, group: int | None = None) -> tuple[Endpoint, ...]:
        """The endpoints of kind ``stream`` served (in node group ``group``, when given)."""
        return tuple(
            e for w in self.workers if group is None or w.group == group for e in w.serves if e.stream is stream
        )

    @property
    def groups(self) -> tuple[int, ...]:
        """The node groups, in order of first appearance (the trainers' first)."""
        return tuple(dict.fromkeys(w.group for w in self.workers))

    def in_group(self, group: int) -> tuple[WorkerSpec, ...]:
        """The workers placed in node group ``group``."""
        return tuple(w for w in self.workers if w.group == group)

    def peers(self, worker: WorkerSpec) -> tuple[WorkerSpec, ...]:
        """The workers that restart together with ``worker`` (itself included)."""
        if worker.restart is Restart.FROM_CHECKPOINT:
            return tuple(w for w in self.of(worker.role) if w.policy == worker.policy)
        return (worker,)

    def in_start_order(self, workers: list[WorkerSpec]) -> list[WorkerSpec]:
        """``workers`` sorted as the table is (servers before their clients)."""
        rank = {w.name: k for k, w in enumerate(self.workers)}
        return sorted(workers, key=lambda w: rank[w.name])


# --------------------------------------------------------------------------- the built-in roles
def _ray(plan: Plan) -> bool:
    return plan.cfg.runtime == "ray"


def _snapshots(plan: Plan, group: int, index: int, policy: int = 0) -> Endpoint:
    """Where a reader in node group ``group`` loads policy ``policy``'s snapshots: the root server itself in flat
    mode, else a relay's buffer (under Ray its own node's; on one machine readers are spread over the relays by
    index), or the lead trainer's buffer when there are no relays (or, under Ray, on the trainers' node)."""
    if plan.cfg.params.mode == "flat":
        return Endpoint(Stream.PARAMS, policy=policy)
    groups = plan.relay_groups
    if not groups or (_ray(plan) and group < 0):
        return Endpoint(Stream.SNAPSHOTS, policy=policy)
    return Endpoint(Stream.SNAPSHOTS, group if _ray(plan) else index % groups, policy)


def _every_policy(plan: Plan, group: int, index: int) -> tuple[Endpoint, ...]:
    """Where a reader of every policy's parameters loads each one's snapshots."""
    return tuple(_snapshots(plan, group, index, k) for k in range(len(plan.policies)))


def _relay_upstream(plan: Plan, relay: int) -> Endpoint:
    """The server relay ``relay`` (of its policy's tree) subscribes to (the tree rule is
    ``param_service.relay_parent``; its parent comes before it)."""
    g, k = relay % plan.relay_groups, relay // plan.relay_groups
    parent = relay_parent(g, plan.cfg.params.fan_out)
    servers = [Endpoint(Stream.PARAMS), *(Endpoint(Stream.PARAMS, h) for h in range(g))]
    found = next(e for e in servers if e.name == parent)
    return Endpoint(found.stream, found.index, k)


def _relay_serves(plan: Plan, relay: int) -> tuple[Endpoint, ...]:
    """Its group's buffer, and a socket only when relays hang below it."""
    g, k = relay % plan.relay_groups, relay // plan.relay_groups
    name, fan_out = Endpoint(Stream.PARAMS, g).name, plan.cfg.params.fan_out
    children = any(relay_parent(h, fan_out) == name for h in range(plan.relay_groups))
    return (Endpoint(Stream.SNAPSHOTS, g, k),) + ((Endpoint(Stream.PARAMS, g, k),) if children else ())


def _actor_connects(plan: Plan, actor: int) -> tuple[Endpoint, ...]:
    """Actor ``a`` feeds trainer ``a % trainers``, through a stage of its node group when the run has one; a
    policy worker of its node group answers it (spread by pool row), or it runs the policy itself and reads
    snapshots like a policy worker."""
    samples: tuple[Endpoint, ...]
    if plan.stages_per_node:
        samples = (Endpoint(Stream.STAGE, plan.stage_of(actor)),)
    else:
        samples = tuple(Endpoint(Stream.SAMPLES, plan.trainer_of(actor, k)) for k in range(len(plan.policies)))
    if plan.cfg.workers.policy_workers == 0:
        return (*samples, *_every_policy(plan, plan.actor_node(actor), actor))
    return (*samples, Endpoint(Stream.INFERENCE, plan.policy_of(actor)))


def _stage_connects(plan: Plan, stage: int) -> tuple[Endpoint, ...]:
    """The sample streams of the trainers its actors feed, and snapshots (read for their version only) as a
    policy worker of its node group reads them."""
    actors = (a for a in range(plan.cfg.workers.actors) if plan.stages_per_node and plan.stage_of(a) == stage)
    samples = tuple(Endpoint(Stream.SAMPLES, t) for t in sorted({plan.trainer_of(a) for a in actors}))
    return (*samples, _snapshots(plan, plan.stage_node(stage), stage))


def _has_root(plan: Plan) -> int:
    return int(plan.cfg.params.mode == "flat" or plan.relay_groups > 0)


def _trainer_serves(plan: Plan, trainer: int) -> tuple[Endpoint, ...]:
    """Its sample stream, and the lead trainer of each policy its policy's snapshot buffer."""
    lead = trainer % plan.cfg.workers.trainers == 0
    buffer = (Endpoint(Stream.SNAPSHOTS, policy=plan.policy_of_trainer(trainer)),) if lead else ()
    return (Endpoint(Stream.SAMPLES, trainer), *buffer)


TRAINER = Role(
    "trainer",
    count=lambda plan: plan.cfg.workers.trainers * len(plan.policies),
    builder="srl.runtime.build:build_trainer",
    seed_salt=0,
    group=lambda plan, i: trainer_group(plan.trainer_node(i)),
    serves=_trainer_serves,
    restart=Restart.FROM_CHECKPOINT,
    cpus=lambda plan: plan.cfg.ray.cpus_per_trainer,
    gpus=lambda plan: plan.cfg.ray.trainer_gpus,
    policy=lambda plan, i: plan.policy_of_trainer(i),
)
PARAM_ROOT = Role(
    "param_root",
    count=lambda plan: _has_root(plan) * len(plan.policies),
    builder="srl.runtime.build:build_param_root",
    seed_salt=3,
    serves=lambda plan, k: (Endpoint(Stream.PARAMS, policy=k),),
    connects=lambda plan, k: (Endpoint(Stream.SNAPSHOTS, policy=k),),
    policy=lambda plan, k: k,
)
RELAY = Role(
    "relay",
    count=lambda plan: plan.relay_groups * len(plan.policies),
    builder="srl.runtime.build:build_relay",
    seed_salt=4,
    group=lambda plan, r: r % plan.relay_groups,
    serves=_relay_serves,
    connects=lambda plan, r: (_relay_upstream(plan, r),),
    policy=lambda plan, r: r // plan.relay_groups,
)
POLICY = Role(
    "policy",
    count=lambda plan: plan.cfg.workers.policy_workers,
    builder="srl.runtime.build:build_policy",
    seed_salt=1,
    group=lambda plan, p: plan.policy_node(p),
    serves=lambda plan, p: (Endpoint(Stream.INFERENCE, p),),
    connects=lambda plan, p: _every_policy(plan, plan.policy_node(p), p),
    cpus=lambda plan: plan.cfg.ray.cpus_per_policy_worker,
)
STAGE = Role(
    "stage",
    count=lambda plan: plan.stages_per_node * plan.nodes,
    builder="srl.runtime.build:build_stage",
    seed_salt=6,
    group=lambda plan, s: plan.stage_node(s),
    serves=lambda plan, s: (Endpoint(Stream.STAGE, s),),
    connects=_stage_connects,
    cpus=lambda plan: plan.cfg.ray.cpus_per_stage,
)
ACTOR = Role(
    "actor",
    count=lambda plan: plan.cfg.workers.actors,
    builder="srl.runtime.build:build_actor",
    seed_salt=2,
    group=lambda plan, a: plan.actor_node(a),
    connects=_actor_connects,
    cpus=lambda plan: plan.cfg.ray.cpus_per_actor,
)
EVAL = Role(
    "eval",
    count=lambda plan: int(plan.eval_every > 0),
    builder="srl.runtime.build:build_eval",
    seed_salt=5,
    connects=lambda plan, i: _every_policy(plan, TRAINER_NODE, i),
)

LEAGUE = Role(
    "league",
    count=lambda plan: int(plan.cfg.league.pool),
    builder="srl.runtime.build:build_league",
    seed_salt=7,
    connects=lambda plan, i: (_snapshots(plan, TRAINER_NODE, i),),
)

ROLES = (TRAINER, PARAM_ROOT, RELAY, POLICY, STAGE, ACTOR, EVAL, LEAGUE)
"""In start order: trainers publish the first snapshot, parameter servers bind before their readers, a stage
(when the config names one: ``stage.worker``) before the actors that submit to it."""


def topology_of(plan: Plan, roles: Sequence[Role]) -> Topology:
    """Every worker of the run, from the declarations of its ``roles`` (in start order; node groups only under
    Ray)."""
    workers = []
    for role in roles:
        for i in range(role.count(plan)):
            workers.append(
                WorkerSpec(
                    role,
                    i,
                    role.group(plan, i) if _ray(plan) else LOCAL_GROUP,
                    role.serves(plan, i),
                    role.connects(plan, i),
                    role.restart,
                    role.cpus(plan),
                    role.gpus(plan),
                    role.policy(plan, i),
                )
            )
    return Topology(tuple(workers))
