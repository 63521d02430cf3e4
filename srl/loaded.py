"""A trained policy for your own code: ``srl.load_policy(run_dir).act(obs)``.

It reads the checkpoint safely (``torch.load(weights_only=True)``), rebuilds
the acting policy of the run's algorithm from the config saved inside, checks
that the env's spaces are the ones it was trained on, and loads the policy
snapshot (so it works for any algorithm plugin, not only PPO). ``act`` takes
observations as the env gives them: one observation, or a batch of them
(nested dicts and tuples for Dict and Tuple spaces), and returns actions the
env accepts (Box actions clipped to the bounds, ``start`` offsets added). For
a multi-agent env (a PettingZoo ``ParallelEnv``) it takes the env's dict of
per-agent observations and returns a dict of per-agent actions; in a run of
several policies (``agents`` rules) each agent is answered by its own policy.

:func:`load_policies` is the one reader of a run's trained policies: ``srl eval``, league opponents and
``srl.load_policy`` all load through it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from srl.api.config import ConfigError, ExperimentConfig, apply_overrides, build, load_config
from srl.api.config.policies import DEFAULT_POLICY
from srl.api.plugins import missing_from_main
from srl.api.spaces import ObsPart, action_spec, check_fits, flatten_obs, obs_parts
from srl.api.worker import Policy
from srl.envs.slots import probe_groups
from srl.nets.memory import Remembering, act_keyed, remembering
from srl.system.checkpoint import ACTING_ENTRIES, checkpoints, load_checkpoint
from srl.system.run_dir import policy_checkpoints
from srl.wiring import acting_policy


class LoadedPolicy:
    """The acting policy of a checkpoint, for single observations or batches."""

    def __init__(
        self,
        policy: Policy,
        cfg: ExperimentConfig,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        to_env: Callable[[np.ndarray], np.ndarray],
        info: dict,
        agents: list[str] | None = None,
        seat_key: str | None = None,
        seats: dict[str, int] | None = None,
    ) -> None:
        """``to_env``: the env factory's own action adapter (clipping, start offsets), applied to a batch;
        ``agents``: a multi-agent env's agent ids this policy plays (the spaces are then each agent's);
        ``seat_key``: the observation key that tells the policy which agent it plays (``env.agent_id``), filled
        in here with ``seats[agent]`` (by default the agent's index in ``agents``)."""
        # a policy with memory keeps the state of the batch's rows between calls; reset() starts them afresh
        self.policy, self.config, self.agents, self._seat_key = remembering(policy), cfg, agents, seat_key
        self._seats = seats if seats is not None else {a: i for i, a in enumerate(agents or ())}
        self.observation_space, self.action_space = obs_space, action_space
        self._to_env = to_env
        self.version: int = int(info["version"])
        self.checkpoint: str = info["checkpoint"]
        self._parts: tuple[ObsPart, ...] = obs_parts(obs_space)

    def act(self, obs: Any, deterministic: bool = True) -> Any:
        """Actions for ``obs`` (one observation, or a batch with a leading dimension; for a multi-agent env, a
        dict of agent id -> observation, answered with agent id -> action); greedy unless told not."""
        if self.agents is not None:
            if not isinstance(obs, dict) or not set(obs) <= set(self.agents):
                raise ValueError(f"a multi-agent policy acts on a dict of agent id -> observation ({self.agents})")
            ids = list(obs)
            seat = self._seat_key
            own = [obs[a] if seat is None else _seated(obs[a], seat, self._seats[a]) for a in ids]
            rows = [_one(self._parts, o, f"agent {a!r}: ") for a, o in zip(ids, own)]
            batch = {p.name: np.stack([r[p.name] for r in rows]) for p in self._parts}
            return dict(zip(ids, self._act(batch, deterministic, ids)))
        batch, size = _batched(self._parts, obs)
        actions = self._act(batch, deterministic)
        return actions[0] if size is None else actions

    def reset(self, ended: Any = None) -> None:
        """Forget what a policy with memory remembers of the rows where ``ended`` is set (every row when None):
        call it when their episodes end; for a multi-agent env, ``ended`` is the agent ids whose episodes ended.
        A policy without memory has nothing to forget. With memory, each call of :meth:`act` is taken as the next
        step of the same rows (a batch of another size starts afresh); a multi-agent env's agents each keep
        their own state, stepped by the calls that name them (a turn-based game's player by its own moves)."""
        if not isinstance(self.policy, Remembering):
            return
        if self.agents is not None and ended is not None:
            self.policy.reset(keys=[ended] if isinstance(ended, str) else list(ended))
            return
        self.policy.reset(None if ended is None else np.atleast_1d(np.asarray(ended, bool)))

    def _act(self, batch: dict[str, np.ndarray], deterministic: bool, keys: list[str] | None = None) -> np.ndarray:
        """Env actions for a batch of flat observation parts (``keys``: the agent of each row)."""
        with torch.inference_mode():
            if keys is None:
                out = self.policy.act(batch, deterministic=deterministic)
            else:
                out = act_keyed(self.policy, batch, deterministic, keys)
            actions = np.asarray(out["actions"])
        if isinstance(self.action_space, spaces.Box):
            actions = actions.reshape((-1, *self.action_space.shape))
        return np.asarray(self._to_env(actions))


def _batched(parts: tuple[ObsPart, ...], obs: Any) -> tuple[dict[str, np.ndarray], int | None]:
    """``obs`` (one observation, or a batch of N) as part name -> ``(N, *shape)`` array, and N (None for one).

    Why checked here: a reshape would turn an observation of twice the size into a batch of two without a word,
    and name neither the part nor the shape expected when it fails."""
    arrays = {p.name: _part(p, parts, obs, "", batch=True) for p in parts}
    leads = [(p, arrays[p.name].shape[: arrays[p.name].ndim - len(p.shape)]) for p in parts]
    first, lead = leads[0]
    for other, theirs in leads[1:]:
        if theirs != lead:
            raise ValueError(f"act: {_label(first)} is {_count(lead)} and its {_path(other)!r} {_count(theirs)}")
    batch = {name: a.reshape((-1, *a.shape[len(lead) :])) for name, a in arrays.items()}
    return batch, (lead[0] if lead else None)


def _one(parts: tuple[ObsPart, ...], obs: Any, where: str) -> dict[str, np.ndarray]:
    """``obs``, exactly one observation, as part name -> array; ValueError naming ``where`` and the part."""
    return {p.name: _part(p, parts, obs, where, batch=False) for p in parts}


def _part(part: ObsPart, parts: tuple[ObsPart, ...], obs: Any, where: str, batch: bool) -> np.ndarray:
    """One part of ``obs`` as an array of its dtype: its own shape, or with ``batch`` that shape under one
    leading dimension; one ValueError line naming the part, its shape and the one expected otherwise."""
    try:
        value = flatten_obs((part,), obs)[part.name]
    except (KeyError, IndexError, TypeError):
        reads = ", ".join(repr(_path(p)) for p in parts)
        raise ValueError(f"act: {where}the observation has no {_path(part)!r} (the policy reads {reads})") from None
    try:
        array = np.asarray(value, dtype=part.dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"act: {where}{_label(part)} is not an array of {part.dtype} ({exc})") from None
    extra = array.ndim - len(part.shape)
    if extra not in ((0, 1) if batch else (0,)) or array.shape[extra:] != part.shape:
        expected = f"{part.shape}, or {_batch_shape(part.shape)} for a batch of N" if batch else f"{part.shape}"
        raise ValueError(f"act: {where}{_label(part)} has shape {array.shape}; expected {expected}")
    return array


def _path(part: ObsPart) -> str:
    """Where a part sits in a Dict / Tuple observation (``position``, ``0.goal``); empty for a plain one."""
    return part.name.partition(".")[2]


def _label(part: ObsPart) -> str:
    """A part as an error line names it: the observation, or the observation's ``'position'``."""
    return f"the observation's {_path(part)!r}" if _path(part) else "the observation"


def _count(lead: tuple[int, ...]) -> str:
    """A part's leading dimensions in words: one observation or a batch of N."""
    return f"a batch of {lead[0]}" if lead else "one observation"


def _batch_shape(shape: tuple[int, ...]) -> str:
    """``shape`` under a batch dimension N, as a tuple is written: ``(N,)``, ``(N, 4)``."""
    return f"(N, {', '.join(map(str, shape))})" if shape else "(N,)"


def _seated(obs: Any, key: str, index: int) -> dict[str, Any]:
    """One agent's observation as ``env.agent_id`` lays it out (:func:`srl.envs.multiagent.seat_space`)."""
    return {**obs, key: index} if isinstance(obs, dict) else {"observation": obs, key: index}


class LoadedPolicies:
    """The policies of a run of several (``agents`` rules): ``act`` answers each agent of a multi-agent env's
    dict of observations with its own policy (``by_policy[name]``, a :class:`LoadedPolicy`)."""

    def __init__(self, by_policy: dict[str, LoadedPolicy], info: dict) -> None:
        self.by_policy = by_policy
        self.agents = [a for p in by_policy.values() for a in p.agents or ()]
        self.version: int = int(info["version"])
        self.checkpoints: dict[str, str] = dict(info.get("checkpoints", {}))

    def act(self, obs: dict[str, Any], deterministic: bool = True) -> dict[str, Any]:
        """Agent id -> action for a dict of agent id -> observation (any subset of the env's agents)."""
        if not isinstance(obs, dict) or not set(obs) <= set(self.agents):
            raise ValueError(f"a multi-agent policy acts on a dict of agent id -> observation ({self.agents})")
        out: dict[str, Any] = {}
        for policy in self.by_policy.values():
            mine = {a: o for a, o in obs.items() if a in (policy.agents or ())}
            if mine:
                out.update(policy.act(mine, deterministic))
        return {a: out[a] for a in obs}

    def reset(self) -> None:
        """Forget what policies with memory remember (:meth:`LoadedPolicy.reset`)."""
        for policy in self.by_policy.values():
            policy.reset()


def load(target: Path) -> LoadedPolicy | LoadedPolicies:
    """See :func:`srl.load_policy`."""
    cfg, policies, info = load_policies(target)
    names = cfg.policy_names
    if cfg.population.enabled and target.is_dir():  # a population's best member (its best team) acts for its run
        policies, info = best_of(target, cfg, policies, info)
        names = tuple(info["members"])
        info["checkpoints"] = {cfg.member_of(n)[0]: info["checkpoints"][n] for n in names}  # the run's policies
    if len(policies) == 1:
        return _loaded(cfg.for_policy(names[0]) if cfg.population.enabled else cfg, policies[0], info, None)
    groups = probe_groups(cfg.env, cfg.agents).groups  # the run's policies: a team's members play theirs
    by_policy = {g.policy: _loaded(cfg.for_policy(n), p, info, g.agents) for g, n, p in zip(groups, names, policies)}
    return LoadedPolicies(by_policy, info)


def _loaded(cfg: ExperimentConfig, policy: Policy, info: dict, only: tuple[str, ...] | None) -> LoadedPolicy:
    """One policy as it acts in its env: on the agents ``only`` (all of them when None) of a multi-agent env."""
    from srl.envs.factory import ClipToBox, ShiftActions, create_env, wrap_env
    from srl.envs.multiagent import AGENT, action_adapter, agent_spaces, is_parallel_env, seat_space
    from srl.envs.turns import TurnSlot, is_aec_env, is_openspiel_game

    raw = create_env(cfg.env)
    seat = AGENT if cfg.env.agent_id else None
    if is_aec_env(raw) or is_openspiel_game(raw):
        slot = TurnSlot(cfg.env, 1, raw, lambda: create_env(cfg.env), cfg.env.agent_id)
        try:
            obs_space: spaces.Space = slot.single_observation_space
            action_space: spaces.Space = slot.single_action_space
            every = list(slot.agents)
        finally:
            slot.close()
        agents = every if only is None else list(only)
        seats = {a: every.index(a) for a in agents}  # the seat among all players, as the turn slot gives it
        return LoadedPolicy(policy, cfg, obs_space, action_space, lambda a: a, info, agents, seat, seats)
    if is_parallel_env(raw):
        try:
            agents, obs_space, action_space = agent_spaces(raw, cfg.env.id, only)
        finally:
            raw.close()
        adapt = action_adapter(action_space)[1]
        if cfg.env.agent_id:  # the index among the policy's own agents, as its slot group gives it
            obs_space = seat_space(obs_space, len(agents))
        return LoadedPolicy(policy, cfg, obs_space, action_space, adapt, info, agents, seat)
    env = wrap_env(cfg.env, raw)
    try:
        # Observations as the configured env (with its preprocessing) gives them; actions as the env takes them
        # before our own action adapter (clipping, start offsets), which act() applies instead.
        obs_space, action_space = env.observation_space, env.action_space
        to_env: Callable[[np.ndarray], np.ndarray] = np.asarray
        if isinstance(env, (ClipToBox, ShiftActions)):
            action_space, to_env = env.env.action_space, env.action
    finally:
        env.close()
    return LoadedPolicy(policy, cfg, obs_space, action_space, to_env, info)


def best_member(run_dir: Path, cfg: ExperimentConfig) -> str:
    """A population's best member (of several policies, team: ``member<k>``): the one its final evaluation
    names (``summary.json``), else the one the population worker scored highest last (``population/state.json``;
    a team by its members' mean score), else the first."""
    names = cfg.population.names()
    try:
        best = json.loads((run_dir / "summary.json").read_text()).get("population", {}).get("best")
        if best in names:
            return str(best)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        members = json.loads((run_dir / "population" / "state.json").read_text())["members"]
        scores = [m.get("last_score") if m.get("last_score") is not None else float("-inf") for m in members]
        if len(scores) != len(cfg.policy_names):
            return names[0]
        return names[int(np.argmax(np.reshape(scores, (len(names), -1)).mean(axis=1)))]
    except (OSError, ValueError, KeyError, TypeError):
        return names[0]


def best_of(
    run_dir: Path, cfg: ExperimentConfig, policies: Sequence[Policy], info: dict[str, Any]
) -> tuple[list[Policy], dict[str, Any]]:
    """Of a population's members loaded by :func:`load_policies`, the best team (:func:`best_member`): its
    members' policies, one per policy of the run (a run of one policy: the best member alone), with ``member``
    naming it in ``info``, ``members`` its members, and its first member's checkpoint and version."""
    best = best_member(run_dir, cfg)
    bases = len(cfg.base_policies)
    k = cfg.population.names().index(best)
    team = cfg.policy_names[k * bases : (k + 1) * bases]
    info = {
        **info,
        "member": best,
        "members": list(team),
        "checkpoint": info["checkpoints"][team[0]],
        "version": info["versions"][team[0]],
    }
    return [policies[cfg.policy_names.index(n)] for n in team], info


def load_policies(target: Path, overrides: Sequence[str] = ()) -> tuple[ExperimentConfig, list[Policy], dict[str, Any]]:
    """The config and the acting policy of each policy of a run directory (each one's newest checkpoint), or of
    one checkpoint file (a run of one policy). ``overrides`` (``key=value``) change how the saved config acts (a
    search's simulations: ``alphazero.search.simulations=128``); one that no longer fits the checkpoint's weights
    is one line."""
    target = Path(target)
    if target.is_dir():
        saved = target / "config.yaml"
        cfg = load_config(saved) if saved.is_file() else None
        names = cfg.policy_names if cfg is not None else (DEFAULT_POLICY,)
        files = []
        for name in names:
            folder = policy_checkpoints(target, cfg, name) if cfg is not None else target / "checkpoints"
            found = checkpoints(folder)
            if not found:
                raise ConfigError(f"{target}: no checkpoint (expected {folder}/ckpt_*.pt)")
            files.append(found[-1])
    elif target.is_file():
        files = [target]
    else:
        raise ConfigError(f"{target}: no such run directory or checkpoint")
    states = []
    for path in files:
        try:
            states.append(load_checkpoint(path, ACTING_ENTRIES))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    cfg = build(ExperimentConfig, apply_overrides(states[0]["config"], list(overrides)), prefix="checkpoint config: ")
    require_env_reachable(cfg)
    alone = cfg.population.enabled and len(cfg.base_policies) == 1  # one member of a population plays alone
    if len(cfg.policy_names) != len(files) and not alone:
        raise ConfigError(f"{target}: a checkpoint of one of {len(cfg.policy_names)} policies; give the run directory")
    on_state = ()  # acting policies never read the global state
    members = cfg.policy_names if cfg.population.enabled else ()
    groups = {g.policy: g for g in probe_groups(cfg.env, cfg.agents, on_state, members).groups}
    policies = []
    for path, state in zip(files, states):
        name = str(state.get("policy", cfg.policy_names[0]))
        group = groups.get(name)
        if group is None:
            raise ConfigError(f"{path}: policy {name!r} is not one of its config's ({', '.join(groups)})")
        obs_space, action_space = group.observation_space, group.action_space
        policy = acting_policy(obs_space, action_space, cfg.for_policy(name))
        try:
            check_fits(state["spaces"], obs_parts(obs_space), action_spec(action_space), str(path))
            policy.load_flat(state["policy_state"].numpy())
        except (KeyError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"{path}: does not fit its own config ({type(exc).__name__}: {exc})") from None
        policies.append(policy)
    info: dict[str, Any] = {"checkpoint": str(files[0]), "version": int(states[0]["version"])}
    if len(files) > 1:
        info["checkpoints"] = {n: str(p) for n, p in zip(cfg.policy_names, files)}
        info["versions"] = {n: int(state["version"]) for n, state in zip(cfg.policy_names, states)}
    return cfg, policies, info


def require_env_reachable(cfg: ExperimentConfig) -> None:
    """One line when the run's env was defined in the ``__main__`` of the script that trained it and this program
    has no such thing: the generic "not in __main__" would leave the user guessing why training found it."""
    attr = missing_from_main(cfg.env.id)
    if attr is not None:
        raise ConfigError(
            f"env.id: {cfg.env.id!r} was defined in the __main__ of the script that trained this run, which only "
            f"that script has: move {attr!r} to an importable module and train with env.id 'module:{attr}'"
        )


def load_policy(target: Path) -> tuple[ExperimentConfig, Policy, dict[str, Any]]:
    """The config and acting policy of a run of one policy (see :func:`load_policies`); of a population's run
    directory, its best member (:func:`best_member`)."""
    cfg, policies, info = load_policies(target)
    if cfg.population.enabled and Path(target).is_dir():
        policies, info = best_of(Path(target), cfg, policies, info)
    if len(policies) > 1:
        raise ConfigError(f"{target}: a run of {len(policies)} policies ({', '.join(cfg.policy_names)}); one is needed")
    return cfg, policies[0], info
