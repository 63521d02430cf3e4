"""Evaluation: play a policy for a number of episodes (the final evaluation of a run, the eval worker and
``srl eval``), optionally recording MP4 video.

It plays a policy in environments and places nothing, so it lives below ``srl.runtime`` (which calls it for the
final evaluation and the eval worker) and above ``algorithms`` and ``envs`` (the acting policy, the slots). It
reads only the spaces and the config of a run's plan (:class:`PlannedRun`), so it needs no import of the runtime.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from srl.api.config import ConfigError, ExperimentConfig, build
from srl.api.spaces import action_spec, check_fits, obs_parts
from srl.api.worker import Policy
from srl.envs.slots import GymSlot, make_slot, probe_spaces
from srl.system.trainer_worker import checkpoints, load_checkpoint
from srl.wiring import acting_policy


class PlannedRun(Protocol):
    """What evaluation reads of a run's plan (``srl.runtime.plan.Plan`` has it)."""

    @property
    def cfg(self) -> ExperimentConfig: ...

    @property
    def obs_space(self) -> gym.spaces.Space: ...

    @property
    def action_space(self) -> gym.spaces.Space: ...

    @property
    def turn_based(self) -> bool: ...


VS_RANDOM_GAMES = 100
"""Games against a uniform random player in the final evaluation of a two-player turn-based game."""


def eval_seed(cfg: ExperimentConfig) -> int:
    """The environment seed of every evaluation of a run (final, during training, ``srl eval``), so their
    returns compare like for like."""
    return cfg.seed + 999_983


def evaluate(
    plan: PlannedRun,
    flat_params: np.ndarray,
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_steps: int = 100_000,
) -> dict[str, float]:
    """Mean/std return over ``episodes`` episodes, one per environment of one slot (one forward per step); in a
    two-player turn-based game also the result of :data:`VS_RANDOM_GAMES` games against a random player.

    An env without a time limit could run forever under a deterministic policy: after ``max_steps``
    the episodes still running are counted with their return so far (``unfinished`` says how many).
    """
    policy = acting_policy(plan.obs_space, plan.action_space, plan.cfg)
    policy.load_flat(flat_params)
    out = play(plan.cfg, policy, episodes, seed, deterministic, max_steps)
    if plan.turn_based and out["agents_per_episode"] == 2:
        # Self-play returns of a zero-sum game average 0 whatever the policy: a match says how strong it is.
        from srl.league.match import play_match

        match = play_match(plan.cfg, policy, "random", VS_RANDOM_GAMES, seed, deterministic)
        out.update({f"vs_random_{k}": v for k, v in match.as_dict().items()})
    return out


def play(
    cfg: ExperimentConfig,
    policy: Policy,
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_steps: int = 100_000,
    video: Path | None = None,
) -> dict[str, Any]:
    """Play ``episodes`` episodes at once (one slot); with ``video``, the first one is written there as MP4."""
    env_cfg = cfg.env
    if video is not None:  # frames come from Gymnasium envs (ALE screens are read directly)
        env_cfg = dataclasses.replace(
            env_cfg,
            backend="gymnasium",
            kwargs=env_cfg.kwargs if _is_ale(env_cfg.id) else {**env_cfg.kwargs, "render_mode": "rgb_array"},
        )
    slot = make_slot(env_cfg, episodes)
    frames: list[np.ndarray] = []
    try:
        obs = slot.reset(seed)
        columns = slot.num_envs  # episodes x agents: every agent's return counts
        returns = np.zeros(columns)
        lengths = np.zeros(columns, np.int64)
        finished = np.zeros(columns, bool)
        first = slot.venv.envs[0] if video is not None and isinstance(slot, GymSlot) else None
        if first is not None:
            frames.append(_frame(first))
        with torch.inference_mode():
            for _ in range(max_steps):
                if finished.all():
                    break
                actions = policy.act(obs, deterministic=deterministic)["actions"]
                step = slot.step(actions)
                obs = step.obs
                returns += np.where(finished, 0.0, step.reward)
                lengths += ~finished
                if first is not None and not finished[0] and not step.episode_end[0]:
                    frames.append(_frame(first))
                finished |= step.episode_end
    finally:
        slot.close()
    out: dict[str, Any] = {
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "episodes": episodes,
        "agents_per_episode": slot.agents_per_env,
        "unfinished": int((~finished).sum()),
        "returns": returns.tolist(),
        "lengths": lengths.tolist(),
    }
    if video is not None:
        out.update(video=str(video), video_frames=_write_mp4(video, frames, _fps(cfg.env.id)))
    return out


def _is_ale(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def _frame(env: gym.Env) -> np.ndarray:
    """The env's current RGB frame: the emulator screen for Atari, ``render()`` otherwise."""
    ale = getattr(env.unwrapped, "ale", None)
    if ale is not None:
        return np.asarray(ale.getScreenRGB())
    try:
        frame = env.render()
    except Exception as exc:  # a missing renderer (pygame, OpenGL) raises many types
        raise ConfigError(f"--video: the env cannot render frames: {type(exc).__name__}: {exc}") from None
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise ConfigError("--video: the env did not render an RGB frame")
    return frame


def _fps(env_id: str) -> int:
    if _is_ale(env_id):
        return 15  # one frame per agent step (frame skip 4 at 60 Hz)
    try:
        return int(gym.spec(env_id).kwargs.get("render_fps") or gym.make(env_id).metadata.get("render_fps", 30))
    except Exception:  # a custom factory id: no registry entry
        return 30


def _write_mp4(path: Path, frames: list[np.ndarray], fps: int) -> int:
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise ConfigError("--video needs imageio and imageio-ffmpeg: pip install -e '.[video]'") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.mp4")
    with imageio.get_writer(tmp, fps=fps, codec="libx264", quality=7, macro_block_size=2) as writer:
        for frame in frames:
            writer.append_data(frame)  # type: ignore[attr-defined]
    tmp.replace(path)  # a reader never sees a half-written video
    return len(frames)


def load_policy(target: Path) -> tuple[ExperimentConfig, Policy, dict[str, Any]]:
    """The config and acting policy of a run directory (its newest checkpoint) or of one checkpoint file."""
    target = Path(target)
    if target.is_dir():
        found = checkpoints(target / "checkpoints")
        if not found:
            raise ConfigError(f"{target}: no checkpoint (expected {target / 'checkpoints'}/ckpt_*.pt)")
        target = found[-1]
    elif not target.is_file():
        raise ConfigError(f"{target}: no such run directory or checkpoint")
    try:
        state = load_checkpoint(target)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg = build(ExperimentConfig, state["config"], prefix="checkpoint config: ")
    probed = probe_spaces(cfg.env)
    obs_space, action_space = probed.obs, probed.action
    policy = acting_policy(obs_space, action_space, cfg)
    try:
        check_fits(state["spaces"], obs_parts(obs_space), action_spec(action_space), str(target))
        policy.load_flat(state["policy_state"].numpy())
    except (KeyError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{target}: does not fit its own config ({type(exc).__name__}: {exc})") from None
    return cfg, policy, {"checkpoint": str(target), "version": int(state["version"])}
