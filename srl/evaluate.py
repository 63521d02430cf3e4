"""Evaluation: play a policy for a number of episodes (the final evaluation of a run, the eval worker and
``srl eval``), optionally recording MP4 video.

It plays a policy in environments and places nothing, so it lives below ``srl.runtime`` (which calls it for the
final evaluation and the eval worker) and above ``algorithms`` and ``envs`` (the acting policy, the slots). It
reads only the spaces and the config of a run's plan (:class:`PlannedRun`), so it needs no import of the runtime.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from srl.api.config import ConfigError, ExperimentConfig, build, load_config
from srl.api.config.policies import DEFAULT_POLICY
from srl.api.config.population import MEMBER
from srl.api.env import OneGroup
from srl.api.plugins import missing_from_main
from srl.api.spaces import action_spec, check_fits, obs_parts
from srl.api.worker import Policy
from srl.envs.slots import make_grouped, probe_groups
from srl.envs.video import Film, recording_env, write_mp4
from srl.nets.memory import Remembering, remembering
from srl.system.run_dir import policy_checkpoints
from srl.system.trainer_worker import ACTING_ENTRIES, checkpoints, load_checkpoint
from srl.text.task import TextTask, evaluation_env
from srl.wiring import acting_policy


class PlannedPolicy(Protocol):
    """What evaluation reads of one policy's plan (``srl.runtime.plan.PolicyPlan`` has it)."""

    @property
    def name(self) -> str: ...

    def acting_policy(self) -> Policy: ...


class PlannedRun(Protocol):
    """What evaluation reads of a run's plan (``srl.runtime.plan.Plan`` has it)."""

    @property
    def cfg(self) -> ExperimentConfig: ...

    @property
    def policies(self) -> Sequence[PlannedPolicy]: ...

    @property
    def vs_random(self) -> bool: ...


VS_RANDOM_GAMES = 100
"""Games against a uniform random player in the final evaluation of a two-player turn-based game."""


TEXT_SAMPLES = 8
"""Completions an evaluation of a text task shows (prompt, completion, reward) besides its score."""


def eval_seed(cfg: ExperimentConfig) -> int:
    """The environment seed of every evaluation of a run (final, during training, ``srl eval``), so their
    returns compare like for like."""
    return cfg.seed + 999_983


def evaluate(plan: PlannedRun, snapshots: Sequence[np.ndarray], episodes: int, seed: int) -> dict[str, Any]:
    """:func:`evaluate_policies` of the policies whose flat parameters are ``snapshots`` (one per planned
    policy), deterministically."""
    policies = []
    for planned, flat in zip(plan.policies, snapshots):
        policy = planned.acting_policy()
        policy.load_flat(flat)
        policies.append(policy)
    return evaluate_policies(plan, policies, episodes, seed)


def evaluate_policies(
    plan: PlannedRun,
    policies: Sequence[Policy],
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_steps: int = 100_000,
) -> dict[str, Any]:
    """Mean/std return over ``episodes`` episodes, one per environment of one slot (one forward per policy per
    step), with each policy's own under ``policies``; when one policy plays a two-player turn-based game
    (``plan.vs_random``) also the result of :data:`VS_RANDOM_GAMES` games against a random player
    (``vs_random_win_rate``, ``_draw_rate``, ``_loss_rate``, ``_score``, ``_games``). Both the final evaluation
    and the eval worker play this.

    An env without a time limit could run forever under a deterministic policy: after ``max_steps``
    the episodes still running are counted with their return so far (``unfinished`` says how many).
    """
    out = play(plan.cfg, policies, episodes, seed, deterministic, max_steps)
    if plan.vs_random:
        # Self-play returns of a zero-sum game average 0 whatever the policy: a match says how strong it is.
        from srl.league.match import play_match

        match = play_match(plan.cfg, policies[0], "random", VS_RANDOM_GAMES, seed, deterministic)
        out.update({f"vs_random_{k}": v for k, v in match.as_dict().items()})
    return out


def play_members(
    cfg: ExperimentConfig,
    members: Sequence[Policy],
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_steps: int = 100_000,
) -> dict[str, Any]:
    """A population: each team (member ``k`` of every policy; a run of one policy's member ``k`` alone) plays
    ``episodes`` episodes of its own (the same seeds), and the best team's results are the evaluation's
    (``best`` names it: ``member<k>``); each member's are under ``policies``."""
    bases, names = cfg.base_policies, cfg.policy_names
    teams = {}
    per_member = {}
    for k in range(cfg.population.members):
        team = range(k * len(bases), (k + 1) * len(bases))
        played = play_team(cfg, [members[i] for i in team], episodes, seed, deterministic, max_steps)
        teams[MEMBER.format(k)] = played
        mine = played.pop("policies", None) or {bases[0]: played}
        per_member.update({names[i]: mine[bases[i % len(bases)]] for i in team})
    best = max(teams, key=lambda n: teams[n]["return_mean"])  # the first of equals
    out = {**teams[best], "best": best}
    out["policies"] = {
        n: {"return_mean": r["return_mean"], "return_std": r["return_std"]} for n, r in per_member.items()
    }
    return out


def play(
    cfg: ExperimentConfig,
    policies: Sequence[Policy],
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_steps: int = 100_000,
    video: Path | None = None,
) -> dict[str, Any]:
    """Play ``episodes`` episodes at once (one slot), each policy its agents (:func:`play_team`); a population's
    teams each play apart (:func:`play_members`)."""
    if cfg.population.enabled and len(policies) > 1:
        if video is not None:
            raise ConfigError("--video: films one policy; give one member's checkpoint file")
        return play_members(cfg, policies, episodes, seed, deterministic, max_steps)
    return play_team(cfg, policies, episodes, seed, deterministic, max_steps, video)


def play_team(
    cfg: ExperimentConfig,
    policies: Sequence[Policy],
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_steps: int = 100_000,
    video: Path | None = None,
) -> dict[str, Any]:
    """Play ``episodes`` episodes at once (one slot), each of ``policies`` the agents of one policy of the
    ``agents`` rules, in their order; with ``video``, the first one is written there as MP4. The return is the
    mean over every agent's episode return; each policy's (over its agents) is under ``policies``."""
    env_cfg = evaluation_env(cfg.env)
    film = None
    if video is not None:
        env_cfg = recording_env(env_cfg)
        film = Film(env_cfg.id)
    slot = make_grouped(env_cfg, episodes, cfg.agents, watch=None if film is None else film.watch)
    policies = [remembering(p) for p in policies]  # a policy with memory keeps each episode's state here
    try:
        obs = slot.reset_groups(seed)
        columns = [episodes * g.agents_per_env for g in slot.groups]  # episodes x agents: every agent counts
        returns = [np.zeros(n) for n in columns]
        lengths = np.zeros(episodes, np.int64)
        finished = [np.zeros(n, bool) for n in columns]
        inner = slot.slot if isinstance(slot, OneGroup) else None
        samples: list[dict[str, Any]] = []
        with torch.inference_mode():
            for _ in range(max_steps):
                if all(f.all() for f in finished):
                    break
                actions = [p.act(o, deterministic=deterministic)["actions"] for p, o in zip(policies, obs)]
                if isinstance(inner, TextTask) and not samples:  # a few of the first completions, to read
                    shown = min(TEXT_SAMPLES, episodes)
                    texts = inner.completions(actions[0][:shown])
                    samples = [{"prompt": p, "completion": c} for p, c in zip(inner.prompts[:shown], texts)]
                steps = slot.step_groups(actions)
                if samples and "reward" not in samples[0]:
                    for sample, reward in zip(samples, steps[0].reward):
                        sample["reward"] = float(reward)
                obs = [step.obs for step in steps]
                for policy, step in zip(policies, steps):
                    if isinstance(policy, Remembering):
                        policy.carry(step.terminated, step.truncated, step.alive)
                running = ~np.all([f.reshape(episodes, -1).all(axis=1) for f in finished], axis=0)
                lengths += running
                for ret, done, step in zip(returns, finished, steps):
                    ret += np.where(done, 0.0, step.reward)
                for done, step in zip(finished, steps):
                    done |= step.episode_end
    finally:
        slot.close()
    every = np.concatenate(returns)
    out: dict[str, Any] = {
        "return_mean": float(every.mean()),
        "return_std": float(every.std()),
        "episodes": episodes,
        "agents_per_episode": sum(g.agents_per_env for g in slot.groups),
        "unfinished": int(sum((~f).sum() for f in finished)),
        "returns": every.tolist(),
        "lengths": lengths.tolist(),
    }
    if samples:
        out["samples"] = samples
    if len(slot.groups) > 1:
        out["policies"] = {
            g.policy: {"return_mean": float(r.mean()), "return_std": float(r.std())}
            for g, r in zip(slot.groups, returns)
        }
    if video is not None and film is not None:
        out.update(video=str(video), video_frames=write_mp4(video, film.frames, film.fps))
    return out


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


def load_policies(target: Path) -> tuple[ExperimentConfig, list[Policy], dict[str, Any]]:
    """The config and the acting policy of each policy of a run directory (each one's newest checkpoint), or of
    one checkpoint file (a run of one policy)."""
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
    cfg = build(ExperimentConfig, states[0]["config"], prefix="checkpoint config: ")
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
