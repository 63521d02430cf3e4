"""Evaluation: play a policy for a number of episodes (the final evaluation of a run, the eval worker and
``srl eval``), optionally recording MP4 video.

It plays a policy in environments and places nothing, so it lives below ``srl.runtime`` (which calls it for the
final evaluation and the eval worker) and above ``algorithms`` and ``envs`` (the acting policy, the slots). It
reads only the spaces and the config of a run's plan (:class:`PlannedRun`), so it needs no import of the runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from srl.api.config import ConfigError, ExperimentConfig
from srl.api.config.population import MEMBER
from srl.api.env import OneGroup
from srl.api.worker import Policy
from srl.envs.slots import make_grouped
from srl.envs.video import Film, recording_env, write_mp4
from srl.nets.memory import Remembering, remembering
from srl.text.task import TextTask, evaluation_env


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
