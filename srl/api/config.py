"""Experiment configuration: typed, frozen dataclasses, one docstring per field.

An experiment is one YAML file (see ``configs/``) mapped onto
:class:`ExperimentConfig`. Command-line overrides use dotted keys
(``--set ppo.lr=0.001``). Everything is validated when it is built: a wrong
key, type or value raises :class:`ConfigError` whose message names the field,
so the CLI can print one line and exit non-zero. Configs are never mutated
after parsing; derive a new one with :func:`dataclasses.replace` instead.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml


class ConfigError(ValueError):
    """A config field is missing, unknown, of the wrong type or out of range."""


def _check(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{name}: {msg}")


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """Which environment each actor slot runs."""

    id: str = "CartPole-v1"
    """A Gymnasium id (``CartPole-v1``) or ``package.module:factory`` returning a ``gymnasium.Env``."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment constructor."""
    max_episode_steps: int | None = None
    """Override of the time limit; ``None`` keeps the environment's own."""
    backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """Slot backend: a Gymnasium vector env (the reference) or an EnvPool batch (faster, optional extra)."""
    normalize_reward: bool = False
    """Scale training rewards by the running std of the discounted return (MuJoCo); reported returns stay true."""
    reward_clip: float | None = None
    """Clip training rewards to ``[-reward_clip, reward_clip]`` after scaling (Atari: 1); ``None`` disables."""
    nonfinite: Literal["fail", "sanitize"] = "fail"
    """A NaN or infinite observation or reward: ``fail`` ends the run naming the env and step; ``sanitize``
    replaces it by 0 and counts it (``nonfinite_steps`` in the metrics)."""

    def __post_init__(self) -> None:
        _check(bool(self.id.strip()), "id", "must name an environment")
        _check(self.reward_clip is None or self.reward_clip > 0, "reward_clip", "must be > 0 or null")
        _check(
            self.max_episode_steps is None or self.max_episode_steps > 0,
            "max_episode_steps",
            f"must be > 0, got {self.max_episode_steps}",
        )


@dataclass(frozen=True, kw_only=True)
class WorkersConfig:
    """How many workers of each kind, and how they are shaped. Placement is the runtime's job."""

    actors: int = 1
    """Actor workers; each owns a ring of environment slots."""
    ring_size: int = 2
    """Environment slots per actor. While one slot waits for its actions the actor steps another."""
    envs_per_slot: int = 8
    """Environments in one slot (one Gymnasium vector env); one inference request covers them all."""
    policy_workers: int = 1
    """Policy (inference) workers. 0 means inline inference: each actor runs the policy itself."""
    trainers: int = 1
    """Trainer workers for the policy, data-parallel over torch.distributed (gloo on CPU); actor ``a`` feeds
    trainer ``a % trainers``, so ``actors`` must be at least ``trainers``. Several need the local runtime."""
    max_inference_batch: int = 64
    """Auto-batching cap: a policy worker merges at most this many pending requests (slots) per forward pass."""
    segment_length: int = 32
    """Steps per trajectory segment ``[T, B, ...]`` sent on the sample stream."""
    sample_buffers: int = 0
    """Segment buffers per actor (in flight + queued for the trainer); 0 picks ``ring_size + 2``.
    Fewer buffers bound policy lag by back-pressure; more let actors run ahead of the trainer."""
    torch_threads: int = 1
    """Torch intra-op threads in each worker process."""
    trainer_device: str = "cpu"
    """Where trainers run the update: ``cpu``, ``cuda`` or ``cuda:N`` (policy workers and actors stay on the CPU)."""
    param_pull_interval: int = 1
    """Policy workers check the parameter service every this many forward passes."""
    param_version_stride: int = 1
    """Staleness injection for experiments: policy workers load a new snapshot only once it is at least this
    many versions newer than the one they hold. 1 (always the newest) is the normal setting."""
    max_restarts: int = 3
    """Local runtime: an actor or policy worker process that dies is restarted up to this many times each
    (its unfinished segments are dropped and counted); one more death ends the run. 0 disables restarts."""
    request_timeout_seconds: float = 10.0
    """An actor asks again for a slot's actions after waiting this long (its policy worker may have died)."""
    start_method: Literal["auto", "fork", "exec"] = "auto"
    """How the local runtime starts worker processes: ``fork`` (Linux; torch is imported once) or ``exec``
    (a fresh interpreter per worker, handed its config as JSON; the only choice off Linux). ``auto`` picks."""

    def __post_init__(self) -> None:
        for name in (
            "actors",
            "ring_size",
            "envs_per_slot",
            "trainers",
            "max_inference_batch",
            "segment_length",
            "torch_threads",
            "param_pull_interval",
            "param_version_stride",
        ):
            value = getattr(self, name)
            _check(value >= 1, name, f"must be >= 1, got {value}")
        _check(self.policy_workers >= 0, "policy_workers", f"must be >= 0, got {self.policy_workers}")
        _check(self.max_restarts >= 0, "max_restarts", f"must be >= 0, got {self.max_restarts}")
        _check(
            self.request_timeout_seconds > 0,
            "request_timeout_seconds",
            f"must be > 0, got {self.request_timeout_seconds}",
        )
        _check(
            self.trainer_device == "cpu"
            or self.trainer_device == "cuda"
            or (self.trainer_device.startswith("cuda:") and self.trainer_device[5:].isdigit()),
            "trainer_device",
            f"must be cpu, cuda or cuda:N, got {self.trainer_device!r}",
        )
        _check(
            self.actors >= self.trainers,
            "trainers",
            f"each trainer needs at least one actor feeding it: {self.trainers} trainers, {self.actors} actors",
        )
        _check(
            self.sample_buffers == 0 or self.sample_buffers >= self.ring_size + 1,
            "sample_buffers",
            f"must be 0 (auto) or >= ring_size + 1 = {self.ring_size + 1}, got {self.sample_buffers}",
        )

    @property
    def buffers_per_actor(self) -> int:
        """Segment buffers each actor owns in the sample stream."""
        return self.sample_buffers or self.ring_size + 2


@dataclass(frozen=True, kw_only=True)
class ParamsConfig:
    """The parameter service: how snapshots travel from the lead trainer to the policy workers."""

    mode: Literal["hierarchical", "flat"] = "hierarchical"
    """``hierarchical``: one relay per node group mirrors each snapshot into the group's shared memory, where its
    readers load it, so the root sends one copy per relay; ``flat``: every reader subscribes to the root itself
    (one copy per reader; kept for comparison)."""
    groups: int = 1
    """Node groups (on one machine, simulated: each group gets its own relay and buffer). With 1 group in
    hierarchical mode the readers share the trainer's buffer and nothing goes over a socket."""
    fan_out: int = 8
    """Children per server in the relay tree: the root serves at most this many relays, which serve the rest."""
    transfer_dtype: Literal["float32", "float16"] = "float32"
    """Dtype of snapshots on the network (float16 halves the bytes; readers compute in float32)."""

    def __post_init__(self) -> None:
        _check(self.groups >= 1, "groups", f"must be >= 1, got {self.groups}")
        _check(self.fan_out >= 1, "fan_out", f"must be >= 1, got {self.fan_out}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Network shape, shared by the policy (actor) and value (critic) networks."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the MLPs."""
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    """Hidden activation."""
    layer_norm: bool = False
    """LayerNorm after each hidden linear layer."""
    normalize_obs: bool = True
    """Running mean/std observation normalization inside the networks (its statistics ship with the parameters)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions; state-independent, learned)."""
    shared_encoder: bool = False
    """The critic's head sits on the actor's encoder (one CNN/MLP torso for both) instead of its own copy.

    Halves the update cost where the encoder dominates it (the Nature CNN on Atari). The critic head
    still never leaves the trainer; the value loss then also shapes the actor's features.
    """

    def __post_init__(self) -> None:
        _check(
            len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden),
            "hidden",
            f"must be a non-empty list of positive widths, got {list(self.hidden)}",
        )


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """Proximal Policy Optimization hyper-parameters."""

    lr: float = 3e-4
    """Adam learning rate."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """``linear`` anneals the learning rate to 0 at ``run.total_env_steps``."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip: float = 0.2
    """Clipping range of the probability ratio."""
    value_clip: float | None = None
    """Clipping range of the value update around the pre-update values; ``None`` disables it."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches per epoch."""
    batch_segments: int = 4
    """Segments per training batch; a batch holds ``batch_segments * segment_length * envs_per_slot`` samples."""
    max_grad_norm: float | None = 0.5
    """Gradient-norm clip, applied to the actor's and the critic's gradients separately; ``None`` disables it.
    With ``grad_clip: adaptive`` it is the threshold used until the window of recent norms has filled."""
    grad_clip: Literal["fixed", "adaptive"] = "fixed"
    """``fixed`` clips at ``max_grad_norm``; ``adaptive`` at the ``grad_clip_percentile``-th percentile of the
    last ``grad_clip_window`` gradient norms (per network), so the threshold follows the gradient scale."""
    grad_clip_percentile: float = 90.0
    """Percentile of recent gradient norms used as the adaptive threshold."""
    grad_clip_window: int = 100
    """Recent gradient norms (minibatches) the adaptive threshold is taken over."""
    unitwise_clip: float | None = None
    """Unit-wise clipping: each output unit's gradient norm is capped at this times its weight norm
    (adaptive gradient clipping of Brock et al. 2021; e.g. 0.1). ``None`` disables it."""
    critic: Literal["decentralized", "centralized"] = "decentralized"
    """``decentralized``: snapshots carry the actor only, and with several trainers each keeps and trains its
    own critic (only actor gradients are all-reduced). ``centralized``: the critic is all-reduced and
    broadcast with the actor, as in designs that evaluate values on the policy workers."""
    td_compensation: bool = False
    """Correct for policy lag: the clipped ratio is taken against the current (proximal) policy, and each
    sample's surrogate is weighted by its importance weight current/behaviour truncated at ``is_rho_clip``
    (decoupled PPO). Samples older than ``max_policy_lag`` are dropped either way."""
    vtrace_targets: bool = False
    """Also correct the TD errors (weights truncated at ``is_rho_clip``) and traces (at ``is_c_clip``) of the
    advantages and value targets: V-trace with a lambda. Measured worse on CartPole (docs/benchmarks.md)."""
    is_rho_clip: float = 1.0
    """Truncation of the importance weights on the surrogate and on TD errors (V-trace's rho bar)."""
    is_c_clip: float = 1.0
    """Truncation of the importance weights on traces (V-trace's c bar)."""
    normalize_values: bool = False
    """Value normalization: the critic predicts returns standardized by running return statistics."""
    normalize_advantages: bool = True
    """Normalize advantages per minibatch."""
    max_policy_lag: int = 16
    """Segments whose oldest step is more than this many versions behind the trainer are dropped (and counted)."""

    def __post_init__(self) -> None:
        for name in ("lr", "adam_eps", "clip", "vf_coef"):
            _check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, name, f"must be in [0, 1], got {value}")
        _check(self.ent_coef >= 0, "ent_coef", f"must be >= 0, got {self.ent_coef}")
        _check(self.value_clip is None or self.value_clip > 0, "value_clip", "must be > 0 or null")
        _check(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")
        for name in ("epochs", "minibatches", "batch_segments"):
            _check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        _check(self.max_policy_lag >= 0, "max_policy_lag", f"must be >= 0, got {self.max_policy_lag}")
        _check(
            0 < self.grad_clip_percentile <= 100,
            "grad_clip_percentile",
            f"must be in (0, 100], got {self.grad_clip_percentile}",
        )
        _check(self.grad_clip_window >= 2, "grad_clip_window", f"must be >= 2, got {self.grad_clip_window}")
        _check(self.unitwise_clip is None or self.unitwise_clip > 0, "unitwise_clip", "must be > 0 or null")
        for name in ("is_rho_clip", "is_c_clip"):
            _check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """When to stop, what to record."""

    total_env_steps: int = 1_000_000
    """Stop after this many environment steps."""
    target_return: float | None = None
    """Stop as solved when the mean return of the last ``return_window`` episodes reaches this."""
    return_window: int = 20
    """Episodes averaged for the progress line and the target."""
    max_wall_seconds: float | None = None
    """Stop after this much wall time; ``None`` for no limit."""
    checkpoint_interval_seconds: float = 120.0
    """Seconds between periodic checkpoints (a final one is always written)."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept in ``checkpoints/`` (older ones are deleted after each write)."""
    log_interval_seconds: float = 1.0
    """Seconds between progress lines and metrics records."""
    eval_episodes: int = 10
    """Deterministic episodes played with the final policy for ``final_eval_return_mean``; 0 skips."""
    eval_every_versions: int = 0
    """During training, an eval worker plays ``eval_episodes`` episodes every this many policy versions and keeps
    the best policy in ``checkpoints/best.pt``; 0 (default) runs no eval worker."""
    tensorboard: bool = True
    """Write TensorBoard event files next to ``metrics.jsonl``."""
    wandb_project: str | None = None
    """Also log every metrics record to this Weights & Biases project (needs ``pip install wandb``;
    ``WANDB_MODE=offline`` keeps it local)."""

    def __post_init__(self) -> None:
        _check(self.total_env_steps >= 1, "total_env_steps", f"must be >= 1, got {self.total_env_steps}")
        _check(self.return_window >= 1, "return_window", f"must be >= 1, got {self.return_window}")
        _check(self.max_wall_seconds is None or self.max_wall_seconds > 0, "max_wall_seconds", "must be > 0 or null")
        _check(self.checkpoint_interval_seconds > 0, "checkpoint_interval_seconds", "must be > 0")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")
        _check(self.log_interval_seconds > 0, "log_interval_seconds", "must be > 0")
        _check(self.eval_episodes >= 0, "eval_episodes", f"must be >= 0, got {self.eval_episodes}")
        _check(self.eval_every_versions >= 0, "eval_every_versions", f"must be >= 0, got {self.eval_every_versions}")
        _check(
            self.eval_every_versions == 0 or self.eval_episodes >= 1, "eval_every_versions", "needs eval_episodes >= 1"
        )


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Placement on a Ray cluster (``runtime: ray``). Workers are grouped by node; nothing else changes.

    Each *actor node* hosts its actors, its policy workers and one parameter relay, joined by that node's
    shared memory; the trainers fill ``trainer_nodes`` more nodes (the first also hosts the root parameter
    server and the eval worker).
    Segments travel from actor nodes to trainers over ZeroMQ TCP, authenticated by a per-run token.
    """

    address: str | None = None
    """The cluster to join: ``auto`` (the one ``ray start`` made on this machine) or ``HOST:PORT`` of its head;
    null starts a private Ray instance on this machine for the run."""
    actor_nodes: int = 1
    """Node groups that host actors. ``workers.actors`` and ``workers.policy_workers`` are split evenly over them."""
    actors_per_node: int | None = None
    """When set, ``workers.actors`` becomes ``actor_nodes x actors_per_node`` (scale a run with one ``--set``)."""
    policy_workers_per_node: int | None = None
    """When set, ``workers.policy_workers`` becomes ``actor_nodes x policy_workers_per_node``."""
    node_resource: str | None = None
    """A custom resource that marks nodes for actors; each actor node group claims one unit of it, so groups land
    on distinct nodes (``ray start --resources '{"srl_actor": 1}'``). Null: Ray places groups where CPUs are free."""
    trainer_nodes: int = 1
    """Node groups that host the trainers; ``workers.trainers`` is split evenly over them. With more than one,
    the data-parallel trainers meet through a TCP store on the first trainer node and gloo connects them over
    the nodes' own interfaces (on one node: a file store and loopback)."""
    trainer_resource: str | None = None
    """A custom resource that marks trainer nodes; each trainer node group claims one unit, so groups land on
    distinct nodes. Null: wherever CPUs (GPUs) are free."""
    trainer_gpus: float = 0.0
    """GPUs each trainer claims (use with ``workers.trainer_device: cuda``)."""
    cpus_per_actor: float = 1.0
    """CPUs claimed per actor worker (placement only: Ray does not pin threads)."""
    cpus_per_policy_worker: float = 1.0
    """CPUs claimed per policy worker."""
    cpus_per_trainer: float = 1.0
    """CPUs claimed per trainer."""
    start_timeout_seconds: float = 300.0
    """How long to wait for the cluster to place every node group before giving up with an error."""

    def __post_init__(self) -> None:
        _check(self.actor_nodes >= 1, "actor_nodes", f"must be >= 1, got {self.actor_nodes}")
        _check(self.trainer_nodes >= 1, "trainer_nodes", f"must be >= 1, got {self.trainer_nodes}")
        for name in ("actors_per_node", "policy_workers_per_node"):
            value = getattr(self, name)
            _check(
                value is None or value >= (1 if name == "actors_per_node" else 0),
                name,
                f"must be >= {1 if name == 'actors_per_node' else 0}, got {value}",
            )
        for name in ("trainer_gpus", "cpus_per_actor", "cpus_per_policy_worker", "cpus_per_trainer"):
            _check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        _check(self.start_timeout_seconds > 0, "start_timeout_seconds", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One experiment: the same file runs under every runtime."""

    name: str = "experiment"
    """Experiment name, used in the run directory name."""
    seed: int = 0
    """Seed of every random stream (environments, networks, sampling)."""
    runtime: Literal["inline", "local", "ray"] = "local"
    """Placement: ``inline`` runs every worker in this process (deterministic), ``local`` one process per worker,
    ``ray`` the same workers as Ray actors across a cluster (see ``ray``)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    """Worker counts and shapes."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Network shape."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters."""
    params: ParamsConfig = field(default_factory=ParamsConfig)
    """The parameter service."""
    run: RunConfig = field(default_factory=RunConfig)
    """Stopping and recording."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Placement on a Ray cluster; read only by ``runtime: ray``."""

    def __post_init__(self) -> None:
        _check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _check(
            self.runtime != "inline" or self.workers.trainers == 1,
            "workers.trainers",
            "the inline runtime runs one trainer; use runtime: local for several",
        )
        _check(
            self.runtime != "inline" or (self.params.mode == "hierarchical" and self.params.groups == 1),
            "params",
            "the inline runtime shares one buffer; relays and flat mode need runtime: local",
        )
        if self.runtime == "ray":
            w, nodes = self.workers, self.ray.actor_nodes
            _check(
                w.actors % nodes == 0,
                "workers.actors",
                f"{w.actors} actors do not split evenly over ray.actor_nodes={nodes}",
            )
            _check(
                w.policy_workers % nodes == 0,
                "workers.policy_workers",
                f"{w.policy_workers} policy workers do not split evenly over ray.actor_nodes={nodes}",
            )
            _check(
                w.trainers % self.ray.trainer_nodes == 0,
                "workers.trainers",
                f"{w.trainers} trainers do not split evenly over ray.trainer_nodes={self.ray.trainer_nodes}",
            )
            _check(
                self.params.mode == "flat" or self.params.groups == nodes,
                "params.groups",
                f"under runtime: ray there is one relay per actor node: must be {nodes}",
            )
            _check(self.workers.start_method == "auto", "workers.start_method", "Ray starts the worker processes")


# --------------------------------------------------------------------------- parsing


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (lists to tuples, ints to floats)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return build(tp, value, prefix=f"{name}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, name)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{name}: {value!r} matches none of {_type_name(tp)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{name}: must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value))
    if origin in (collections.abc.Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{name}: expected a mapping with string keys, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{name}: unsupported field type {_type_name(tp)}")  # pragma: no cover


def build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown field (known: {', '.join(sorted(names))})")
    kwargs = {key: _coerce(value, hints[key], f"{prefix}{key}") for key, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML-friendly dict of a config (tuples become lists)."""

    def plain(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {k: plain(x) for k, x in v.items()}
        return v

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b=value`` into (["a", "b"], parsed YAML scalar/list)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. ppo.lr=0.001")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"{key.strip()}: cannot parse value {raw!r}") from None
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of the raw config mapping with dotted overrides applied."""
    out: dict[str, Any] = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML experiment file (or defaults when ``path`` is None) and apply overrides."""
    data: Any = {}
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}: invalid YAML{where}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    return build(ExperimentConfig, resolve_per_node(apply_overrides(data, overrides or [])))


def resolve_per_node(data: dict[str, Any]) -> dict[str, Any]:
    """Under ``runtime: ray``, turn per-node counts into the totals every worker reads.

    ``ray.actors_per_node`` and ``ray.policy_workers_per_node`` (when given) set ``workers.actors`` and
    ``workers.policy_workers``; a hierarchical parameter service gets one relay group per actor node. The
    saved ``config.yaml`` holds both, consistent, so it loads back to the same experiment.
    """
    ray = data.get("ray") or {}
    if data.get("runtime") != "ray" or not isinstance(ray, dict):
        return data
    out = _deep_copy(data)
    nodes = ray.get("actor_nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool):
        return out  # the typed build reports the bad value
    workers = out.setdefault("workers", {})
    for key, total, least in (("actors_per_node", "actors", 1), ("policy_workers_per_node", "policy_workers", 0)):
        per_node = ray.get(key)
        valid = isinstance(per_node, int) and not isinstance(per_node, bool) and per_node >= least
        if valid and isinstance(workers, dict):  # an invalid value is left for RayConfig to name
            workers[total] = nodes * per_node
    params = out.setdefault("params", {})
    if isinstance(params, dict) and params.get("mode", "hierarchical") == "hierarchical":
        params["groups"] = nodes
    return out
