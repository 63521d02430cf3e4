"""Environment construction from the config: the only place env ids are resolved.

``env.id`` is a Gymnasium id (``CartPole-v1``) or ``package.module:factory``
where ``factory(**kwargs)`` returns a ``gymnasium.Env``. Slots (B envs stepped
together) are built in :mod:`srl.envs.slots`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit

from srl.api.config import ConfigError, EnvConfig
from srl.api.config.errors import did_you_mean
from srl.api.plugins import resolve
from srl.api.spaces import UnsupportedSpace, check_spaces

log = logging.getLogger(__name__)


def _resolve(env_id: str) -> Callable[..., gym.Env]:
    if ":" in env_id:
        return resolve(env_id, {}, "env.id")
    atari = env_id.startswith("ALE/")
    if atari:
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            raise ConfigError(f"env.id: {env_id!r} needs ale-py (pip install 'srl[atari]')") from None
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        raise ConfigError(f"env.id: unknown environment {env_id!r}{did_you_mean(env_id, gym.registry)}") from None
    if "mujoco" in str(spec.entry_point):
        _quiet_mujoco_compiler()
    if atari:
        from srl.envs.atari import make_atari  # imported on demand: needs ale-py and opencv

        # env.kwargs become make_atari's keyword arguments (preprocessing switches, sticky actions).
        return functools.partial(make_atari, env_id)
    return lambda **kw: gym.make(env_id, **kw)


@functools.cache
def _quiet_mujoco_compiler() -> None:
    """Drop one known warning: Gymnasium's MuJoCo models use ``settotalmass``, which MuJoCo 4 deprecates
    and reports at every model load (hundreds of identical lines per run). Other MuJoCo warnings are logged."""
    try:
        import mujoco
    except ImportError:
        return

    def handler(message: str) -> None:
        if "settotalmass" not in message:
            log.warning("mujoco: %s", message)

    mujoco.set_mju_user_warning(handler)


def make_env(cfg: EnvConfig) -> gym.Env:
    """One Gymnasium environment, validated: its spaces must be ones the streams carry (:mod:`srl.api.spaces`).

    Box actions are clipped to the environment's bounds here, so every caller can pass raw policy samples;
    Discrete and MultiDiscrete actions with a ``start`` are shifted, so the policy samples from 0.
    """
    env = create_env(cfg)
    if not isinstance(env, gym.Env):  # create_env lets only multi-agent envs through besides
        if hasattr(env, "close"):
            env.close()
        raise ConfigError(f"env.id: {cfg.id!r} is a multi-agent env; this needs a gymnasium.Env")
    return wrap_env(cfg, env)


def create_env(cfg: EnvConfig, num_envs: int = 1) -> Any:
    """What ``env.id`` makes, unwrapped: a ``gymnasium.Env``, a PettingZoo ``ParallelEnv`` or ``AECEnv``, a VMAS env,
    an OpenSpiel game or a text task (:class:`srl.text.task.TextTask`; see
    :func:`srl.envs.slots.make_slot`); one line naming the env for anything else. A factory that takes a
    ``num_envs`` argument makes a batch of environments at once (VMAS): it gets ``num_envs``."""
    factory = _resolve(cfg.id)
    kwargs: dict[str, Any] = dict(cfg.kwargs)
    if takes(factory, "num_envs"):
        kwargs["num_envs"] = num_envs
    custom = ":" in cfg.id  # a user's factory need not take max_episode_steps: its env gets a TimeLimit instead
    if cfg.max_episode_steps is not None and not custom:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        env = factory(**kwargs)
    except ConfigError:
        raise
    except Exception as exc:  # an env constructor can raise anything; report it in one line
        raise ConfigError(f"env: cannot create {cfg.id!r}: {type(exc).__name__}: {exc}") from None
    if isinstance(env, gym.Env):
        return env
    from srl.envs.multiagent import is_parallel_env
    from srl.envs.turns import is_aec_env, is_openspiel_game
    from srl.envs.vmas_slot import is_vmas_env
    from srl.text.task import TextTask

    if isinstance(env, TextTask):
        if cfg.max_episode_steps is not None:
            raise ConfigError(f"env.max_episode_steps: {cfg.id!r} is a text task; its episodes are one completion")
        if cfg.action_scale is not None:
            raise ConfigError(f"env.action_scale: {cfg.id!r} is a text task; its actions are tokens, not a Box")
        return env
    if is_parallel_env(env) or is_vmas_env(env) or is_aec_env(env) or is_openspiel_game(env):
        if cfg.max_episode_steps is not None:
            raise ConfigError(f"env.max_episode_steps: {cfg.id!r} is a multi-agent env; set its own episode length")
        if cfg.action_scale is not None:
            raise ConfigError(f"env.action_scale: {cfg.id!r} is a multi-agent env; bound its agents' Box in the env")
        return env
    raise ConfigError(
        f"env.id: {cfg.id!r} did not return a gymnasium.Env, a PettingZoo ParallelEnv or AECEnv, a VMAS env, an "
        "OpenSpiel game or a text task"
    )


def takes(factory: Callable[..., Any], name: str, any_keyword: bool = False) -> bool:
    """Whether ``factory`` has a parameter ``name`` (``num_envs``: it makes a batch of environments); with
    ``any_keyword``, ``**kwargs`` counts too (PettingZoo's factories pass theirs on to the env)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return False
    return name in params or (any_keyword and any(p.kind is p.VAR_KEYWORD for p in params.values()))


def wrap_env(cfg: EnvConfig, env: gym.Env) -> gym.Env:
    """``env`` (made by :func:`create_env`) with its time limit and action adapters, its spaces checked."""
    custom = ":" in cfg.id
    if custom and cfg.max_episode_steps is not None:
        env = TimeLimit(env, cfg.max_episode_steps)
    try:
        shown = driven_actions(cfg, env.action_space)
    except ConfigError:
        env.close()
        raise
    if isinstance(shown, gym.spaces.Box):
        env = ClipToBox(env, shown)
    elif isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and np.any(
        np.asarray(env.action_space.start) != 0
    ):
        env = ShiftActions(env)
    try:
        check_spaces(env.observation_space, env.action_space)
    except UnsupportedSpace as exc:
        env.close()
        raise ConfigError(f"env: {cfg.id!r} {exc}") from None
    return env


def driven_actions(cfg: EnvConfig, space: gym.spaces.Space) -> gym.spaces.Space:
    """The action space an env shows, and the bounds its Box actions are clipped to: ``space`` itself, or with
    ``env.action_scale`` the Box whose infinite bounds are ``+-action_scale``; one line naming the field when
    ``action_scale`` has nothing to bound (the space is not a Box, or its bounds are already finite)."""
    scale = cfg.action_scale
    if scale is None:
        return space
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(f"env.action_scale: {cfg.id!r} has {space}, which is not a Box; remove action_scale")
    low, high = np.asarray(space.low), np.asarray(space.high)
    if np.isfinite(low).all() and np.isfinite(high).all():
        raise ConfigError(f"env.action_scale: {cfg.id!r} has {space}, whose bounds are already finite; remove it")
    low = np.where(np.isfinite(low), low, -scale)
    high = np.where(np.isfinite(high), high, scale)
    if not (low < high).all():
        raise ConfigError(f"env.action_scale: {scale} crosses a finite bound of {cfg.id!r}'s {space}")
    return gym.spaces.Box(low.astype(space.dtype), high.astype(space.dtype), space.shape, space.dtype)


class ClipToBox(gym.ActionWrapper):
    """Box actions clipped to ``bounds`` (:func:`driven_actions`), which the env shows as its action space: a
    Gaussian policy (PPO) passes its raw samples (their log-probs refer to those), and an algorithm that maps its
    actions onto the bounds (SAC, TD3) reads them. Gymnasium's ``ClipAction`` would show an unbounded Box instead."""

    def __init__(self, env: gym.Env, bounds: gym.spaces.Box) -> None:
        super().__init__(env)
        self.action_space = bounds
        self._low, self._high = bounds.low, bounds.high

    def action(self, action: Any) -> Any:
        return np.clip(action, self._low, self._high)


class ShiftActions(gym.ActionWrapper):
    """Discrete / MultiDiscrete actions from 0 for the policy, shifted by the space's ``start`` for the env."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space: Any = env.action_space  # Discrete or MultiDiscrete (see make_env)
        self._start = space.start
        if isinstance(space, gym.spaces.Discrete):
            self.action_space = gym.spaces.Discrete(int(space.n))
        else:
            self.action_space = gym.spaces.MultiDiscrete(space.nvec)

    def action(self, action: Any) -> Any:
        return action + self._start
