"""The run's topology as data: one typed record per worker, computed once from the plan.

Why: the wiring is written once (Sample Factory's ``connect_components`` is the
model). Each role is one :class:`Role` declaration, each worker one frozen
:class:`WorkerSpec` computed from it, and building, the fabrics, the runtimes
and the supervisor only query the :class:`Topology`; none of them re-derives
who feeds whom.

Roles and stream kinds are declarations (compared by identity), not members
of closed enums, so that a plugin declares its own without editing ``srl/``:
a role says how many workers it has and where, which endpoints each serves
and connects to, which pool buffers a worker holds (freed when it dies), and,
for a role that can stand between the actors and the trainers, its
:class:`Hop`; what its workers report (:class:`Report`), and the hooks by
which it reaches into the core's workers (a trainer port, the actors' slots,
a resumed run's check). A :class:`StreamKind` says what the fabric creates
for each endpoint of the kind (a channel, a pool). This module declares the
core's roles (trainers, parameter servers, policy workers, actors) and the
:class:`Layout` their rules are written in; the other roles are packages of
their own (``srl.wiring.ROLES`` and ``PATH_ROLES``), and ``workers.roles``
adds a plugin's. The sample path, the hops from the actors to the trainers,
is the list ``workers.path`` of the config. The restart policies
(:class:`Restart`) are what the supervisor branches on, and stay a closed
enum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from srl.api.config import ExperimentConfig
from srl.api.config.run import SELF_PLAY_EVAL_EVERY_VERSIONS
from srl.api.plugins import resolve
from srl.system.param_service import relay_parent
from srl.system.streams import (
    EPISODE_WIDTH,
    FILLING,
    READY,
    REQUEST_WIDTH,
    SAMPLE_WIDTH,
    STAGED,
    PoolLayout,
)

TRAINER_NODE = -1
"""Node group of the first trainer node: the lead trainer, the root parameter server, the eval worker.
Trainer node ``k`` is :func:`trainer_group` ``(k)``; actor nodes are 0, 1, ... Outside Ray every worker is in
:data:`LOCAL_GROUP`."""
LOCAL_GROUP = 0
"""The one node group of a run on one machine (``inline`` and ``local``)."""


NODE_RUNTIMES = ("ray",)
"""The runtimes that place node groups on nodes of their own (the ``ray`` section sizes them)."""


def trainer_group(k: int) -> int:
    """Node-group index of trainer node ``k`` (``TRAINER_NODE``, -2, -3, ...)."""
    return TRAINER_NODE - k


@dataclass(frozen=True)
class StreamKind:
    """One kind of endpoint a worker serves or connects to, declared by whoever adds it (the built-ins are in
    :class:`Stream`; a plugin declares its own). The fabric creates what the declaration asks for each endpoint
    of the kind that a worker serves."""

    name: str
    indexed: str
    """Its endpoints' names, formatted with their index (``trainer{}``): keys of endpoint tables, pipe and socket
    names."""
    single: str | None = None
    """The name of its one unindexed endpoint (the root server's ``root``), if it has one."""
    bound: bool = False
    """Its server binds an address when it starts (a socket; under Ray the streams that cross nodes), which
    clients connect to: servers start before their clients, and clients follow a server that comes back
    elsewhere. The other kinds are node-local names that the node's fabric creates."""
    channel: int = 0
    """Width of the records its channel carries (0: no channel): the fabric creates one per endpoint (a
    node-local pipe, or in-process queue)."""
    mail: bool = False
    """Its endpoints are mailboxes (``srl.system.remote_records``): messages of any size (a meta and a byte
    payload), which its server reads and anyone writes (``Fabric.mailbox``): a state handed between workers."""
    segments: bool = False
    """Its records name buffers of the segment pool (``(actor, buffer)``): a stop on the sample path."""
    pool: str | None = None
    """``module:attr`` of ``layout(plan, endpoint) -> PoolLayout``: each endpoint of the kind has a pool of its
    own buffers (one row), created by its node's fabric (a replay's batches). None: it uses the segment pools."""
    storage: str | None = None
    """``module:attr`` of an opener with ``create(plan, endpoint, name)`` (``name`` None: in this process) and
    ``attach(plan, endpoint, name)``: each endpoint of the kind has storage that outlives its worker (a replay's
    items), created by its node's fabric, so a restarted worker attaches to what its predecessor left. What they
    return has ``close(unlink: bool)``: the fabric's owner unlinks it on every exit path."""


class Stream:
    """The built-in stream kinds."""

    SAMPLES = StreamKind("samples", "trainer{}", bound=True, channel=SAMPLE_WIDTH, segments=True)
    """Trainer ``i``'s sample stream (actors -> trainer)."""
    INFERENCE = StreamKind("inference", "policy{}", channel=REQUEST_WIDTH)
    """Policy worker ``p``'s request stream (actors -> policy worker, answered in place)."""
    PARAMS = StreamKind("params", "relay{}", "root", bound=True)
    """A parameter server's socket: the root (index None) or relay ``g``."""
    SNAPSHOTS = StreamKind("snapshots", "params{}", "params")
    """A node-local snapshot buffer: the lead trainer's (index None) or the one relay ``g`` mirrors into."""
    EPISODES = StreamKind("episodes", "episodes{}", bound=True, channel=EPISODE_WIDTH)
    """An episode sink (the episode tap): every actor sends each one, with each report, each policy's env steps
    and its finished episodes' returns (``streams.episode_records``; across nodes a record channel over ZeroMQ).
    A role that reads them serves one; its index is the sink's own in the run."""
    COMMANDS = StreamKind("commands", "commands{}", bound=True, mail=True)
    """Policy ``k``'s lead trainer's command port, a mailbox served when a role of the run declares a
    :attr:`Role.port`: that role's workers send it commands (with a payload: a state to take), its port answers
    them between updates."""


@dataclass(frozen=True)
class Endpoint:
    """One stream endpoint of the run: a stream kind and which one of it."""

    stream: StreamKind
    index: int | None = None
    """Which one (a trainer, a policy worker, a relay group); None for the root / the lead trainer's buffer."""
    policy: int = 0
    """Whose parameters a parameter endpoint carries (an index into the plan's policies)."""

    @property
    def name(self) -> str:
        """Its key in endpoint tables, pipe and socket names: ``trainer0``, ``policy1``, ``root``, ``relay2``,
        ``params``, ``params3``, and for the parameters of policy ``k`` > 0 ``root_p1``, ``params3_p1``.
        Produced from the record; nothing parses it back."""
        kind = self.stream
        if self.index is None:
            assert kind.single is not None, f"{kind.name} endpoints are indexed"
            name = kind.single
        else:
            name = kind.indexed.format(self.index)
        return f"{name}_p{self.policy}" if self.policy else name


class Restart(Enum):
    """What the supervisor does when a worker dies (always bounded by ``workers.max_restarts`` per worker)."""

    ALONE = "alone"
    """Start it again by itself in its node group; the pool buffers it held are freed (their segments counted
    as dropped) first."""
    FROM_CHECKPOINT = "from_checkpoint"
    """Start it again together with every worker of its role (data-parallel peers cannot go on without it), from
    the newest checkpoint, publishing above every version readers hold. Needs a run directory."""


Rule = Callable[["Layout", int], "tuple[Endpoint, ...]"]
Holding = dict[tuple["int | Endpoint", int], tuple[int, ...]]
"""(Pool, pool row) -> buffer states: the buffers a worker holds (see :meth:`Role.holds`). A pool is a policy's
segment pool (its index) or an endpoint's own pool (the endpoint)."""


def _none(plan: Layout, index: int) -> tuple[Endpoint, ...]:
    return ()


def _no_resources(plan: Layout) -> float:
    return 0.0


@dataclass(frozen=True)
class Hop:
    """What a role on the sample path declares: segments reach its workers between the actors and the trainers.
    The config lists the path (``workers.path``); the core wires each hop to the next from these fields."""

    stream: StreamKind
    """The kind of endpoint each of its workers serves to receive segments (``segments=True``)."""
    route: Callable[[Layout, int, int], int]
    """``route(plan, actor, policy)``: the worker that actor ``actor``'s segments of policy ``policy`` reach."""
    keeps: StreamKind | None = None
    """None: it forwards what it keeps to the next stop of the path (a stage). A kind: it keeps the segments (a
    replay), and serves each trainer it feeds (:attr:`feeds`) through an endpoint of that kind."""
    feeds: Callable[[Layout, int], tuple[int, ...]] = lambda plan, index: (index,)
    """A keeper's: the trainers its worker ``index`` serves (by default trainer ``index``)."""
    batches: str | None = None
    """A keeper's: ``module:attr`` of ``source(plan, fabric, trainer, fresh) -> BatchSource``, where a trainer it
    feeds (a :class:`WorkerSpec`) reads its batches (``fresh``: the trainer starts the run, from no checkpoint)."""


@dataclass(frozen=True)
class Report:
    """What a role's workers report: the kind of their reports and the aggregator that folds them into the run's
    records (:mod:`srl.api.report`). Roles that send the same kind (the root and the relays) name the same."""

    kind: str
    aggregator: str
    """``module:attr`` of the aggregator's class, made once per run as ``cls(facts)``."""

    def make(self, facts: Any) -> Any:
        """The run's aggregator of this kind, fed by ``facts`` (a :class:`~srl.api.report.RunFacts`)."""
        return resolve(self.aggregator, {}, f"{self.kind} report")(facts)


@dataclass(frozen=True, eq=False)
class Role:
    """The declaration of one worker role: everything the core needs to place, wire, build and restart its
    workers. A new role is its worker class plus one of these."""

    name: str
    """Worker names are ``name`` + index (``actor0``): in ``workers.json``, metrics, ``restarts``, log lines."""
    count: Callable[[Layout], int]
    """How many workers of this role the run has."""
    builder: str
    """``module:attr`` of the function that builds one worker from a :class:`~srl.runtime.build.BuildContext`
    (by name, the way a plugin names its own, so that this table needs nothing from the builders)."""
    seed_salt: int
    """Distinct per role: separates its workers' random streams from other roles' (see ``BuildContext.seed``)."""
    group: Callable[[Layout, int], int] = lambda plan, index: TRAINER_NODE
    """Under Ray: the node group worker ``index`` is placed in (by default with the lead trainer)."""
    serves: Rule = _none
    """The endpoints worker ``index`` serves (a hop's segment endpoint is added from :attr:`hop`)."""
    connects: Rule = _none
    """The endpoints worker ``index`` connects to (a hop's next stops are added from the path)."""
    restart: Restart = Restart.ALONE
    """What the supervisor does when one of its workers dies."""
    cpus: Callable[[Layout], float] = _no_resources
    """CPUs each worker claims (placement only; Ray)."""
    gpus: Callable[[Layout], float] = _no_resources
    """GPUs each worker claims (Ray)."""
    policy: Callable[[Layout, int], int | None] = lambda plan, index: None
    """The policy worker ``index`` serves alone (trainers, parameter servers), or None (it serves them all)."""
    hop: Hop | None = None
    """Set for a role that can stand on the sample path (``workers.path`` names it)."""
    holds: Callable[[Layout, int], Holding] | None = None
    """The buffers worker ``index`` holds, in which states: freed when it dies (their contents counted as lost).
    None: what the sample path hands it (:func:`held_on_path`)."""
    report: Report | None = None
    """What its workers report, and how the run's records take it (None: they report nothing of their own)."""
    port: str | None = None
    """``module:attr`` of ``port(ctx) -> TrainerPort | None`` (``srl.api.worker``): what each trainer of a run
    with this role's workers is handed, from its :class:`~srl.runtime.build.BuildContext`: the lead's port
    answers this role's commands (each policy's lead trainer serves a :attr:`Stream.COMMANDS` endpoint), and
    every trainer takes what it was told with its data-parallel peers."""
    check: str | None = None
    """``module:attr`` of ``check(plan)``: what this role needs of a run with its workers, called once the plan is
    made (a ``ConfigError`` naming the setting, before anything starts)."""
    resumed: str | None = None
    """``module:attr`` of ``resumed(plan, run_dir) -> list[str]``, called before a resumed run with this role's
    workers starts: its check of what they left in the run directory (a ``ConfigError`` naming what does not fit,
    before anything is touched), and what to say of it (the run's first warnings)."""
    slots: str | None = None
    """``module:attr`` of ``make(ctx, i) -> GroupedSlot``: how each actor of a run with this role's workers makes
    its slot ``i`` (seating opponents in the other seats of a game, or dealing the envs to several members).
    None: the env's own."""

    def hook(self, name: str) -> Any:
        """The function its declaration names for ``name`` (``builder``, ``port``, ``slots``, ``check``,
        ``resumed``: ``module:attr``), or None when it names none."""
        spec = getattr(self, name)
        return None if spec is None else resolve(spec, {}, f"{self.name} role")


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

    def service(self, stream: StreamKind) -> Endpoint | None:
        """The endpoint of kind ``stream`` this worker serves, if any."""
        return next((e for e in self.serves if e.stream is stream), None)

    def connection(self, stream: StreamKind, policy: int = 0) -> Endpoint | None:
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

    def endpoints(self, stream: StreamKind, group: int | None = None) -> tuple[Endpoint, ...]:
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


@dataclass(frozen=True)
class Layout:
    """Where each worker of a run stands: its counts, its roles, and the index rules (which node group a worker
    is in, which trainer an actor's segments reach, ...) that the roles' declarations are written in. The run's
    :class:`~srl.runtime.plan.Plan` is one, with what the probed environment says besides."""

    cfg: ExperimentConfig
    sample_path: tuple[Role, ...] = field(default=(), kw_only=True)
    """The roles segments pass through between the actors and the trainers (``workers.path``, resolved)."""
    added_roles: tuple[Role, ...] = field(default=(), kw_only=True)
    """The roles beyond the core's and the sample path's: the built-in ones (``srl.wiring.ROLES``), then those
    ``workers.roles`` adds (plugins), in its order."""
    vs_random: bool = field(default=False, kw_only=True)
    """One policy plays a two-player turn-based game (OpenSpiel, PettingZoo AEC; against itself or a pool):
    evaluations also play it against a uniform random player, since self-play's returns average 0 in a zero-sum
    game whatever the policy."""

    @property
    def eval_every(self) -> int:
        """Versions between the eval worker's evaluations, 0 for no eval worker: ``run.eval_every_versions``, or
        when that is unset, :data:`SELF_PLAY_EVAL_EVERY_VERSIONS` in a game measured against random (unless
        ``run.eval_episodes`` is 0: no evaluation at all)."""
        run = self.cfg.run
        if run.eval_every_versions is not None:
            return run.eval_every_versions
        return SELF_PLAY_EVAL_EVERY_VERSIONS if self.vs_random and run.eval_episodes > 0 else 0

    @cached_property
    def staffed_roles(self) -> tuple[Role, ...]:
        """The run's roles that have workers, in start order."""
        return tuple(r for r in roles_of(self) if r.count(self) > 0)

    @cached_property
    def episode_sinks(self) -> tuple[Endpoint, ...]:
        """The episode sinks the run's roles serve (:attr:`Stream.EPISODES`)."""
        return tuple(
            e
            for r in self.staffed_roles
            for i in range(r.count(self))
            for e in r.serves(self, i)
            if e.stream is Stream.EPISODES
        )

    @property
    def policy_count(self) -> int:
        """How many policies the run trains (``cfg.policy_names``)."""
        return len(self.cfg.policy_names)

    @property
    def actors_per_node(self) -> int:
        """Actors of one node group (each policy's pool has a row for each)."""
        return self.cfg.workers.actors // self.nodes

    @property
    def across_nodes(self) -> bool:
        """Whether the run's workers are placed in node groups (Ray), each with its own shared memory and pipes,
        rather than all on this machine."""
        return self.cfg.runtime in NODE_RUNTIMES

    @property
    def nodes(self) -> int:
        """Actor node groups: each has its own pool of segment buffers and its own policy workers."""
        return self.cfg.ray.actor_nodes if self.across_nodes else 1

    @property
    def relay_groups(self) -> int:
        """Relays of the hierarchical parameter service: one per node group (none with a single group on one
        machine, where readers share the trainer's buffer; under Ray every actor node needs its own)."""
        p = self.cfg.params
        if p.mode != "hierarchical":
            return 0
        return p.groups if p.groups > 1 or self.across_nodes else 0

    def actor_node(self, actor: int) -> int:
        """The node group actor ``actor`` lives in."""
        return actor // self.actors_per_node

    def actor_row(self, actor: int) -> int:
        """Actor ``actor``'s row in its node's pool."""
        return actor % self.actors_per_node

    @property
    def policy_workers_per_node(self) -> int:
        """Policy workers of one node group."""
        return self.cfg.workers.policy_workers // self.nodes

    def policy_node(self, policy_worker: int) -> int:
        """The node group policy worker ``policy_worker`` lives in."""
        return policy_worker // self.policy_workers_per_node

    def policy_of(self, actor: int) -> int:
        """The policy worker that serves actor ``actor``: one of its own node's, spread by row."""
        per_node = self.policy_workers_per_node
        return self.actor_node(actor) * per_node + self.actor_row(actor) % per_node

    @property
    def stages_per_node(self) -> int:
        """Stage workers of one node group (0: the run has no stage)."""
        return 0 if self.cfg.stage.worker is None else self.cfg.stage.per_node

    def stage_node(self, stage: int) -> int:
        """The node group stage worker ``stage`` lives in (with the actors it serves)."""
        return stage // self.stages_per_node

    def stage_of(self, actor: int) -> int:
        """The stage worker actor ``actor`` submits to: one of its own node's, spread by row."""
        per_node = self.stages_per_node
        return self.actor_node(actor) * per_node + self.actor_row(actor) % per_node

    def trainer_of(self, actor: int, policy: int = 0) -> int:
        """The trainer of policy ``policy`` that actor ``actor``'s segments go to (through the stage, when there
        is one). Trainers are numbered policy by policy: ``workers.trainers`` of each."""
        per = self.cfg.workers.trainers
        return policy * per + actor % per

    def policy_of_trainer(self, trainer: int) -> int:
        """The policy (index into ``policies``) trainer ``trainer`` trains."""
        return trainer // self.cfg.workers.trainers

    @property
    def trainer_nodes(self) -> int:
        """Node groups the trainers are split over (one outside Ray)."""
        return self.cfg.ray.trainer_nodes if self.across_nodes else 1

    @property
    def policy_nodes(self) -> int:
        """Trainer node groups each policy's trainers are split over: all of them, or one when the run trains
        several members (``cfg.members``: they are dealt over the groups instead)."""
        return 1 if self.cfg.members > 1 else self.trainer_nodes

    def policy_trainer_node(self, trainer: int) -> int:
        """Which of its policy's :attr:`policy_nodes` trainer ``trainer`` lives in (0 holds the policy's lead)."""
        per = self.cfg.workers.trainers
        return (trainer % per) // (per // self.policy_nodes)

    def trainer_node(self, trainer: int) -> int:
        """The trainer node group (0, 1, ...) trainer ``trainer`` lives in: every policy's trainers are split over
        all the groups, the first holding its lead; of several members (``cfg.members``), member ``k`` trains
        whole in group ``k mod trainer_nodes``."""
        if self.cfg.members > 1:
            return self.policy_of_trainer(trainer) % self.trainer_nodes
        return self.policy_trainer_node(trainer)

    def lead_node(self, policy: int) -> int:
        """The trainer node group of policy ``policy``'s lead trainer (its snapshot buffer and parameter root)."""
        return self.trainer_node(policy * self.cfg.workers.trainers)


# --------------------------------------------------------------------------- the built-in roles
def snapshot_endpoint(plan: Layout, group: int, index: int, policy: int = 0) -> Endpoint:
    """Where a reader in node group ``group`` loads policy ``policy``'s snapshots: the root server itself in flat
    mode, else a relay's buffer (under Ray its own node's; on one machine readers are spread over the relays by
    index), or the lead trainer's buffer when there are no relays (or, under Ray, in the lead's trainer group; a
    reader in another trainer group subscribes to the policy's root)."""
    if plan.cfg.params.mode == "flat":
        return Endpoint(Stream.PARAMS, policy=policy)
    groups = plan.relay_groups
    if plan.across_nodes and group < 0 and group != trainer_group(plan.lead_node(policy)):
        return Endpoint(Stream.PARAMS, policy=policy)  # a member trained in another trainer group: its root
    if not groups or (plan.across_nodes and group < 0):
        return Endpoint(Stream.SNAPSHOTS, policy=policy)
    return Endpoint(Stream.SNAPSHOTS, group if plan.across_nodes else index % groups, policy)


def every_snapshot(plan: Layout, group: int, index: int) -> tuple[Endpoint, ...]:
    """Where a reader of every policy's parameters loads each one's snapshots."""
    return tuple(snapshot_endpoint(plan, group, index, k) for k in range(plan.policy_count))


def _relay_upstream(plan: Layout, relay: int) -> Endpoint:
    """The server relay ``relay`` (of its policy's tree) subscribes to (the tree rule is
    ``param_service.relay_parent``; its parent comes before it)."""
    g, k = relay % plan.relay_groups, relay // plan.relay_groups
    parent = relay_parent(g, plan.cfg.params.fan_out)
    servers = [Endpoint(Stream.PARAMS), *(Endpoint(Stream.PARAMS, h) for h in range(g))]
    found = next(e for e in servers if e.name == parent)
    return Endpoint(found.stream, found.index, k)


def _relay_serves(plan: Layout, relay: int) -> tuple[Endpoint, ...]:
    """Its group's buffer, and a socket only when relays hang below it."""
    g, k = relay % plan.relay_groups, relay // plan.relay_groups
    name, fan_out = Endpoint(Stream.PARAMS, g).name, plan.cfg.params.fan_out
    children = any(relay_parent(h, fan_out) == name for h in range(plan.relay_groups))
    return (Endpoint(Stream.SNAPSHOTS, g, k),) + ((Endpoint(Stream.PARAMS, g, k),) if children else ())


def stop(plan: Layout, position: int, actor: int, policy: int = 0) -> Endpoint:
    """The endpoint at ``position`` on the sample path that actor ``actor``'s segments of policy ``policy`` reach:
    a hop of ``plan.sample_path``, or past its end the trainer's sample stream."""
    if position < len(plan.sample_path):
        hop = plan.sample_path[position].hop
        assert hop is not None
        return Endpoint(hop.stream, hop.route(plan, actor, policy))
    return Endpoint(Stream.SAMPLES, plan.trainer_of(actor, policy))


def keeper(plan: Layout) -> Role | None:
    """The role that keeps the segments (a replay, last on the path), or None: the trainers take them."""
    last = plan.sample_path[-1] if plan.sample_path else None
    return last if last is not None and last.hop is not None and last.hop.keeps is not None else None


def position(plan: Layout, role: Role) -> int | None:
    """Where ``role`` stands on the sample path (0: the actors submit to it; the trainers stand at its length
    unless a keeper ends it), or None when segments never reach it."""
    if role in plan.sample_path:
        return plan.sample_path.index(role)
    return len(plan.sample_path) if role is TRAINER and keeper(plan) is None else None


def submitted_state(plan: Layout, at: int) -> int:
    """The pool state of a buffer handed to the stop at ``at``: READY to the last one that takes segments (the
    trainer, or a keeper), STAGED + ``at`` to a hop before it (so each hop's records are told apart)."""
    last = len(plan.sample_path) - (1 if keeper(plan) is not None else 0)
    return READY if at == last else STAGED + at


def receives_on(role: Role, index: int) -> Endpoint:
    """The endpoint worker ``index`` of ``role`` (a stop of the sample path) receives segments on: its hop's, or a
    trainer's sample stream."""
    return Endpoint(role.hop.stream if role.hop is not None else Stream.SAMPLES, index)


def clients(plan: Layout, role: Role, index: int) -> list[tuple[int, int]]:
    """The (actor, policy) pairs whose segments reach worker ``index`` of ``role`` on the sample path."""
    at = position(plan, role)
    if at is None:
        return []
    me = receives_on(role, index)
    pairs = ((a, k) for a in range(plan.cfg.workers.actors) for k in range(plan.policy_count))
    return [(a, k) for a, k in pairs if stop(plan, at, a, k) == me]


def held_on_path(plan: Layout, worker: WorkerSpec, across_nodes: bool = False) -> Holding:
    """The segment buffers ``worker`` holds by its place on the sample path (rows of its node's segment pools):
    an actor those it is filling, a stop those handed to it. ``across_nodes`` (Ray): a stop whose stream is bound
    receives copies from another node and holds nothing in a pool, while its sender holds what waits to go out
    to it."""
    role, index = worker.role, worker.index
    if role is ACTOR:
        return {
            (k, plan.actor_row(index)): (FILLING, *_waiting(plan, 0, index, k, across_nodes))
            for k in range(plan.policy_count)
        }
    at = position(plan, role)
    if at is None:
        return {}
    forwards = role.hop is not None and role.hop.keeps is None
    held: Holding = {}
    for a, k in clients(plan, role, index):
        states: tuple[int, ...] = (
            () if across_nodes and stop(plan, at, a, k).stream.bound else (submitted_state(plan, at),)
        )
        states += _waiting(plan, at + 1, a, k, across_nodes) if forwards else ()
        if states:
            held[(k, plan.actor_row(a))] = states
    return held


def held_by(plan: Layout, worker: WorkerSpec, across_nodes: bool = False) -> Holding:
    """Every buffer ``worker`` holds: by its place on the sample path, and what its role declares besides."""
    extra = worker.role.holds(plan, worker.index) if worker.role.holds is not None else {}
    return {**held_on_path(plan, worker, across_nodes), **extra}


def _waiting(plan: Layout, at: int, actor: int, policy: int, across_nodes: bool) -> tuple[int, ...]:
    """The state of a sender's buffers waiting to go out to the stop at ``at`` on another node (Ray), if any."""
    if across_nodes and stop(plan, at, actor, policy).stream.bound:
        return (submitted_state(plan, at),)
    return ()


def staffed(plan: Layout) -> tuple[Role, ...]:
    """The run's roles that have workers, in start order (computed once per plan)."""
    return plan.staffed_roles


def declared(plan: Layout, what: str) -> Any:
    """The function the role of the run that declares ``what`` names for it (see :func:`declaring`), or None."""
    role = declaring(plan, what)
    return None if role is None else role.hook(what)


def declaring(plan: Layout, what: str) -> Role | None:
    """The role of the run with workers that declares ``what`` (``port``, ``slots``), if any (one at most)."""
    found = [r for r in staffed(plan) if getattr(r, what) is not None]
    if len(found) > 1:
        raise ValueError(f"roles {', '.join(r.name for r in found)} each declare a {what}; a run takes one")
    return found[0] if found else None


def episode_sinks(plan: Layout) -> tuple[Endpoint, ...]:
    """The episode sinks the run's roles serve (:attr:`Stream.EPISODES`): where every actor sends its episodes
    (computed once per plan)."""
    return plan.episode_sinks


def _actor_connects(plan: Layout, actor: int) -> tuple[Endpoint, ...]:
    """Actor ``a`` feeds the first stop of the sample path of each policy (a hop of its node group, or that
    policy's trainer ``a % trainers``); a policy worker of its node group answers it (spread by pool row), or it
    runs the policy itself and reads snapshots like a policy worker."""
    samples = tuple(dict.fromkeys(stop(plan, 0, actor, k) for k in range(plan.policy_count)))
    samples += episode_sinks(plan)
    if plan.cfg.workers.policy_workers == 0:
        return (*samples, *every_snapshot(plan, plan.actor_node(actor), actor))
    return (*samples, Endpoint(Stream.INFERENCE, plan.policy_of(actor)))


def hop_serves(plan: Layout, role: Role, index: int) -> tuple[Endpoint, ...]:
    """A hop's endpoints: the one it receives segments on, and a keeper's to each trainer it feeds."""
    hop = role.hop
    if hop is None or role not in plan.sample_path:
        return ()
    kept = () if hop.keeps is None else tuple(Endpoint(hop.keeps, t) for t in hop.feeds(plan, index))
    return (Endpoint(hop.stream, index), *kept)


def hop_connects(plan: Layout, role: Role, index: int) -> tuple[Endpoint, ...]:
    """Where a hop that forwards sends its clients' segments: the next stop of each."""
    at = position(plan, role)
    if at is None or role.hop is None or role.hop.keeps is not None:
        return ()
    return tuple(sorted({stop(plan, at + 1, a, k) for a, k in clients(plan, role, index)}, key=lambda e: e.name))


def _has_root(plan: Layout) -> int:
    return int(plan.cfg.params.mode == "flat" or plan.relay_groups > 0)


def _trainer_serves(plan: Layout, trainer: int) -> tuple[Endpoint, ...]:
    """Its sample stream (unless a keeper serves it batches), and the lead trainer of each policy its policy's
    snapshot buffer."""
    lead = trainer % plan.cfg.workers.trainers == 0
    k = plan.policy_of_trainer(trainer)
    buffer = (Endpoint(Stream.SNAPSHOTS, policy=k),) if lead else ()
    commands = (Endpoint(Stream.COMMANDS, k),) if lead and declaring(plan, "port") is not None else ()
    samples = (Endpoint(Stream.SAMPLES, trainer),) if keeper(plan) is None else ()
    return (*samples, *buffer, *commands)


def _trainer_connects(plan: Layout, trainer: int) -> tuple[Endpoint, ...]:
    """The keeper's batches, when one ends the path (an endpoint of each trainer, served by the keeper that
    feeds it)."""
    kept = keeper(plan)
    if kept is None or kept.hop is None or kept.hop.keeps is None:
        return ()
    return (Endpoint(kept.hop.keeps, trainer),)


TRAINER = Role(
    "trainer",
    count=lambda plan: plan.cfg.workers.trainers * plan.policy_count,
    builder="srl.runtime.build:build_trainer",
    seed_salt=0,
    group=lambda plan, i: trainer_group(plan.trainer_node(i)),
    serves=_trainer_serves,
    connects=_trainer_connects,
    restart=Restart.FROM_CHECKPOINT,
    cpus=lambda plan: plan.cfg.ray.cpus_per_trainer,
    gpus=lambda plan: plan.cfg.ray.trainer_gpus,
    policy=lambda plan, i: plan.policy_of_trainer(i),
    holds=lambda plan, i: {(e, 0): (READY,) for e in _trainer_connects(plan, i)},
    report=Report("trainer", "srl.system.trainer_worker:TrainerReports"),
)
PARAMS_REPORT = Report("params", "srl.system.param_service:ParamReports")
PARAM_ROOT = Role(
    "param_root",
    count=lambda plan: _has_root(plan) * plan.policy_count,
    builder="srl.runtime.build:build_param_root",
    seed_salt=3,
    group=lambda plan, k: trainer_group(plan.lead_node(k)),  # beside the buffer it serves
    serves=lambda plan, k: (Endpoint(Stream.PARAMS, policy=k),),
    connects=lambda plan, k: (Endpoint(Stream.SNAPSHOTS, policy=k),),
    policy=lambda plan, k: k,
    report=PARAMS_REPORT,
)
RELAY = Role(
    "relay",
    count=lambda plan: plan.relay_groups * plan.policy_count,
    builder="srl.runtime.build:build_relay",
    seed_salt=4,
    group=lambda plan, r: r % plan.relay_groups,
    serves=_relay_serves,
    connects=lambda plan, r: (_relay_upstream(plan, r),),
    policy=lambda plan, r: r // plan.relay_groups,
    report=PARAMS_REPORT,
)
POLICY = Role(
    "policy",
    count=lambda plan: plan.cfg.workers.policy_workers,
    builder="srl.runtime.build:build_policy",
    seed_salt=1,
    group=lambda plan, p: plan.policy_node(p),
    serves=lambda plan, p: (Endpoint(Stream.INFERENCE, p),),
    connects=lambda plan, p: every_snapshot(plan, plan.policy_node(p), p),
    cpus=lambda plan: plan.cfg.ray.cpus_per_policy_worker,
    report=Report("policy", "srl.system.policy_worker:PolicyReports"),
)
ACTOR = Role(
    "actor",
    count=lambda plan: plan.cfg.workers.actors,
    builder="srl.runtime.build:build_actor",
    seed_salt=2,
    group=lambda plan, a: plan.actor_node(a),
    connects=_actor_connects,
    cpus=lambda plan: plan.cfg.ray.cpus_per_actor,
    report=Report("actor", "srl.system.actor_worker:ActorReports"),
)
ROLES = (TRAINER, PARAM_ROOT, RELAY, POLICY, ACTOR)
"""The roles of every run (some with no workers), in start order: trainers publish the first snapshot, parameter
servers bind before their readers. The sample path's roles (``workers.path``) start before the actors, the last
stop first, so that each hop's next stop is up when it starts; the other built-in roles (``srl.wiring.ROLES``)
and the plugins' (``workers.roles``) after them."""


def pool_layout(plan: Layout, endpoint: Endpoint) -> PoolLayout:
    """The layout of ``endpoint``'s own pool, from the function its kind's declaration names."""
    assert endpoint.stream.pool is not None, f"{endpoint.stream.name} endpoints have no pool of their own"
    layout: PoolLayout = resolve(endpoint.stream.pool, {}, f"{endpoint.stream.name} stream")(plan, endpoint)
    return layout


def storage_opener(endpoint: Endpoint) -> Any:
    """The opener ``endpoint``'s kind declares for its storage."""
    assert endpoint.stream.storage is not None, f"{endpoint.stream.name} endpoints have no storage"
    return resolve(endpoint.stream.storage, {}, f"{endpoint.stream.name} stream", callable_=False)


def attach_reports(topology: Topology, controller: Any) -> None:
    """Give ``controller`` (a :class:`~srl.system.controller.Controller`) the run's report table, one aggregator
    per report kind of the roles that have workers (made once, from the declaration's class), and each worker's
    role by the name the plan gave it."""
    aggregators: dict[str, Any] = {}
    for role in dict.fromkeys(w.role for w in topology.workers):
        if role.report is not None and role.report.kind not in aggregators:
            aggregators[role.report.kind] = role.report.make(controller)
    controller.attach(aggregators, {w.name: w.role.name for w in topology.workers})


def roles_of(plan: Layout) -> tuple[Role, ...]:
    """The run's roles in start order: :data:`ROLES` with the sample path's roles before the actors, and the other
    built-in roles and those ``workers.roles`` adds last (every stream of the core's is up before they start)."""
    before = ROLES[: ROLES.index(ACTOR)]
    return (*before, *reversed(plan.sample_path), *ROLES[len(before) :], *plan.added_roles)


def topology_of(plan: Layout, roles: Sequence[Role]) -> Topology:
    """Every worker of the run, from the declarations of its ``roles`` (in start order; node groups only under
    Ray)."""
    workers = []
    for role in roles:
        for i in range(role.count(plan)):
            workers.append(
                WorkerSpec(
                    role,
                    i,
                    role.group(plan, i) if plan.across_nodes else LOCAL_GROUP,
                    (*hop_serves(plan, role, i), *role.serves(plan, i)),
                    (*hop_connects(plan, role, i), *role.connects(plan, i)),
                    role.restart,
                    role.cpus(plan),
                    role.gpus(plan),
                    role.policy(plan, i),
                )
            )
    return Topology(tuple(workers))
