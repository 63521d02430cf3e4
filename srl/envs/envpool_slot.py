"""EnvPool slot backend: one synchronous EnvPool batch behind the :class:`~srl.api.env.Slot` interface.

EnvPool steps its environments in C++ threads, which makes MuJoCo and Atari
several times faster than a Gymnasium vector env in one process. It is an
optional extra (``pip install 'srl[envpool]'``); :class:`srl.envs.slots.GymSlot`
stays the reference, and this slot must be indistinguishable from it:

* **Same-step reset.** EnvPool resets a finished environment on its *next*
  step (ignoring that step's action). The slot instead steps only the finished
  environment ids once more, right away, with a dummy action (``step(a,
  env_id=ids)``), so the returned ``obs`` is already the next policy input.
  We deliberately do not use ``reset(env_id=ids)``: in EnvPool 1.2.5 an explicit
  reset restarts the whole Atari *game* after a mere life loss (lives back to 5,
  elapsed steps to 0), whereas the auto-reset path continues the game, which is
  what episodic life means.
* **Episode ends.** EnvPool's Gymnasium API reports ``terminated = done &
  ~trunc``; with ``episodic_life`` a lost life is ``terminated``, and the game's
  real end is ``info["terminated"]`` (ALE ``game_over``). ``episode_end`` is
  built from that, as GymSlot builds it from the ``life_loss`` info key.
* **Spaces.** Observation spaces come from EnvPool's spec (they equal
  Gymnasium's for every mapped id: shape, dtype and bounds). Box action spaces
  are exposed exactly as GymSlot's ``ClipToBox``-wrapped env exposes them
  (float32, with the bounds of :func:`~srl.envs.factory.driven_actions`; any
  float32 action is accepted) and clipped here to those bounds, which equal
  Gymnasium's.
* **Seeding.** EnvPool takes its seed at construction, so the pool is built by
  ``reset(seed)`` and rebuilt by a later ``reset`` once it has been used: the
  same seed then gives the same episodes, as with GymSlot.

Id mapping (Gymnasium id -> EnvPool task id):

* ``ALE/<Game>-v5`` -> ``<Game>-v5``, configured like our Gymnasium Atari
  preprocessing (:mod:`srl.envs.atari`): 30 random no-ops, frame skip 4 with a
  max-pool over the last two frames, 84x84 grey (INTER_AREA resize), a stack
  of 4 channels-first uint8 frames, episodic life, fire on reset, sticky actions
  with probability 0.25 (EnvPool's default is 0) and reward clipping *off*
  (the actor clips). ``env.kwargs`` override these.
* Gymnasium MuJoCo ids (``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``,
  ``Ant-v5``, ... and their ``-v4``) -> the EnvPool task of the same name, which
  EnvPool 1.2.5 implements after Gymnasium's v4/v5 (same observation layout,
  time limits and default coefficients).
* Classic control with identical spaces (``CartPole-v1``, ``Acrobot-v1``,
  ``MountainCar-v0``, ``MountainCarContinuous-v0``, ``Pendulum-v1``) -> same name.

Known differences from Gymnasium, all rare or small:

* When an episode terminates on the very step its time limit runs out,
  Gymnasium reports ``terminated`` and ``truncated``; EnvPool only ``truncated``
  (it computes ``terminated = done & ~trunc``), so the learner bootstraps from
  that one terminal state.
* Atari, against :func:`srl.envs.atari.make_atari`: after a lost life EnvPool
  takes 0-29 random no-ops and FIRE and keeps the frame stack, where
  ``make_atari`` takes one no-op and FIRE and restarts the stack; after a real
  reset EnvPool takes 0-29 no-ops before FIRE (1-30 without fire reset),
  ``make_atari`` 1-30; ``noop_max=0`` becomes EnvPool's 1 (see
  :func:`_check_atari`). The game's cap is 27000 agent steps in EnvPool and
  108000 emulator frames in ALE (about the same; ALE also counts reset frames).
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError, EnvConfig
from srl.api.env import SlotStep
from srl.api.spaces import OBS, Observation
from srl.envs.factory import driven_actions

_MUJOCO = (
    "Ant",
    "HalfCheetah",
    "Hopper",
    "Humanoid",
    "HumanoidStandup",
    "InvertedDoublePendulum",
    "InvertedPendulum",
    "Pusher",
    "Reacher",
    "Swimmer",
    "Walker2d",
)
_MUJOCO_IDS = frozenset(f"{name}-{version}" for name in _MUJOCO for version in ("v4", "v5"))
_CLASSIC_IDS = frozenset({"CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1"})

ATARI_DEFAULTS: dict[str, Any] = {
    "noop_max": 30,
    "frame_skip": 4,
    "stack_num": 4,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "use_inter_area_resize": True,
    "episodic_life": True,
    "use_fire_reset": True,
    "repeat_action_probability": 0.25,
    "full_action_space": False,
    "reward_clip": False,
}
"""EnvPool Atari options that reproduce our Gymnasium preprocessing (EnvPool's own defaults differ:
no sticky actions, no episodic life)."""

_ATARI_ALIASES = {"fire_reset": "use_fire_reset", "frame_stack": "stack_num"}
"""``srl.envs.atari.make_atari`` spellings of Atari options -> EnvPool's (``screen_size`` sets both image sides;
``noop_max``, ``frame_skip``, ``episodic_life``, ``repeat_action_probability`` are spelled alike)."""

_POOL_KEYS = frozenset({"num_threads", "thread_affinity_offset"})
"""``env.kwargs`` that shape the pool rather than the environment (EnvPool backend only)."""

_RESERVED_KEYS = frozenset(
    {
        "num_envs",
        "batch_size",
        "seed",
        "env_seed",
        "max_num_players",
        "base_path",
        "gym_reset_return_info",
        "task",
        "reward_clip",
    }
)
"""EnvPool options the slot owns; ``reward_clip`` is ``env.reward_clip``'s job (the actor clips)."""


def _import_envpool() -> Any:
    try:
        import envpool
    except ImportError:
        raise ConfigError("env.backend: 'envpool' needs the envpool package (pip install 'srl[envpool]')") from None
    return envpool


def default_num_threads(num_envs: int, env_id: str) -> int:
    """EnvPool worker threads per slot when ``env.kwargs.num_threads`` is not given.

    Classic-control steps take about a microsecond, so handing them to worker
    threads costs more than it saves: one thread (measured on CartPole, 16 envs:
    ~1.5x the steps/s of two threads). Heavier envs get one thread per core
    this process may use, at most one per env; more than that only adds
    contention, since every actor process runs its own pools.
    """
    if env_id in _CLASSIC_IDS:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(num_envs, cores))


def resolve_task(env_id: str, available: set[str] | frozenset[str]) -> tuple[str, bool]:
    """EnvPool task id for a Gymnasium ``env_id`` and whether it is an Atari game.

    Only ids whose EnvPool port we checked against Gymnasium (spaces, time limits)
    are mapped; anything else is refused rather than silently run with other semantics.
    """
    if env_id.startswith("ALE/"):
        task = env_id[len("ALE/") :]
        if task.endswith("-v5") and task in available:
            return task, True
    elif (env_id in _MUJOCO_IDS or env_id in _CLASSIC_IDS) and env_id in available:
        return env_id, False
    raise ConfigError(
        f"env.id: {env_id!r} is not available in EnvPool (backend 'envpool' maps ALE/<Game>-v5, "
        "Gymnasium MuJoCo -v4/-v5 and classic-control ids; use backend 'gymnasium')"
    )


def envpool_options(cfg: EnvConfig, task: str, atari: bool, config_keys: set[str]) -> dict[str, Any]:
    """EnvPool ``make`` options for ``cfg`` (without ``num_envs`` / ``seed``), validated by name.

    ``env.kwargs`` are Gymnasium constructor arguments; those EnvPool spells the
    same pass through, a few known spellings are translated, ``(lo, hi)`` ranges
    are split into ``_min`` / ``_max``, and the rest are refused so that a typo
    or an unsupported option never changes behaviour silently.
    """
    options: dict[str, Any] = dict(ATARI_DEFAULTS) if atari else {}
    for key, value in cfg.kwargs.items():
        name = _ATARI_ALIASES.get(key, key) if atari else key
        if atari and key == "screen_size":
            height, width = (value, value) if isinstance(value, int) else value
            options["img_height"], options["img_width"] = int(height), int(width)
        elif name in _POOL_KEYS:
            options[name] = int(value)
        elif name in _RESERVED_KEYS:
            raise ConfigError(
                f"env.kwargs.{key}: set by the envpool backend itself"
                + ("; use env.reward_clip" if name == "reward_clip" else "")
            )
        elif name in config_keys:
            options[name] = value
        elif (
            key.endswith("_range")
            and isinstance(value, (tuple, list))
            and len(value) == 2
            and f"{key[:-6]}_min" in config_keys
            and f"{key[:-6]}_max" in config_keys
        ):
            options[f"{key[:-6]}_min"], options[f"{key[:-6]}_max"] = float(value[0]), float(value[1])
        else:
            raise ConfigError(f"env.kwargs.{key}: not supported by EnvPool's {task!r}")
    if cfg.max_episode_steps is not None:
        options["max_episode_steps"] = cfg.max_episode_steps
    if atari:
        spelled = {name: key for key, name in _ATARI_ALIASES.items() if key in cfg.kwargs}
        spelled.update({"img_height": "screen_size", "img_width": "screen_size"} if "screen_size" in cfg.kwargs else {})
        _check_atari(options, spelled)
    return options


def _check_atari(options: dict[str, Any], spelled: dict[str, str]) -> None:
    """Refuse Atari settings EnvPool would crash on, and map ``noop_max=0`` to what EnvPool can do.

    EnvPool draws its no-ops from ``uniform(0, noop_max - 1)``: ``noop_max=0`` is
    undefined there (it segfaults in 1.2.5). With ``noop_max=1`` EnvPool takes
    ``1 - fire_reset`` no-ops, i.e. none when FIRE is pressed, which is what
    ``noop_max=0`` means to :func:`srl.envs.atari.make_atari` (one no-op frame more when fire reset is off).
    """
    for name in ("noop_max", "frame_skip", "stack_num", "img_height", "img_width"):
        value = options[name]
        key, least = spelled.get(name, name), 0 if name == "noop_max" else 1
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f"env.kwargs.{key}: must be an integer, got {value!r}")
        if value < least:
            raise ConfigError(f"env.kwargs.{key}: must be >= {least}, got {value}")
    options["noop_max"] = max(1, int(options["noop_max"]))
    if not 0.0 <= float(options["repeat_action_probability"]) <= 1.0:
        raise ConfigError(
            f"env.kwargs.repeat_action_probability: must be in [0, 1], got {options['repeat_action_probability']}"
        )


class EnvPoolSlot:
    """B environments in one synchronous EnvPool batch, with GymSlot's semantics."""

    def __init__(self, cfg: EnvConfig, num_envs: int) -> None:
        if num_envs < 1:
            raise ConfigError(f"workers.envs_per_slot: must be >= 1, got {num_envs}")
        self._envpool = _import_envpool()
        self.task, self.atari = resolve_task(cfg.id, set(self._envpool.list_all_envs()))
        keys = set(self._envpool.make_spec(self.task).config._fields)
        self._options = envpool_options(cfg, self.task, self.atari, keys)
        self._options.setdefault("num_threads", default_num_threads(num_envs, self.task))
        try:
            # The spec alone (no environments) validates the options and gives the spaces.
            spec = self._envpool.make_spec(self.task, num_envs=num_envs, batch_size=num_envs, **self._options)
            obs_space = spec.gymnasium_observation_space
            act_space = spec.gymnasium_action_space
        except ConfigError:
            raise
        except Exception as exc:  # EnvPool raises assorted errors for bad options; report one line
            raise ConfigError(f"env: cannot configure EnvPool {self.task!r}: {type(exc).__name__}: {exc}") from None
        if not isinstance(obs_space, gym.spaces.Box):
            raise ConfigError(f"env: {cfg.id!r} observation space {obs_space} is not a Box")
        self.num_envs = num_envs
        self.agents_per_env = 1
        self.state_space: gym.spaces.Space | None = None
        self.single_observation_space: gym.spaces.Space = obs_space
        self.single_action_space: gym.spaces.Space
        shown: Any = driven_actions(cfg, act_space)
        if isinstance(shown, gym.spaces.Discrete):
            self.single_action_space = gym.spaces.Discrete(int(shown.n), start=int(shown.start))
            self._low = self._high = None
        elif isinstance(shown, gym.spaces.Box):
            # As GymSlot's env (ClipToBox over Gymnasium's float32 Box): the bounds are shown, any float32 action
            # is accepted, and the env sees it clipped to those bounds in EnvPool's float64 below.
            self.single_action_space = gym.spaces.Box(
                shown.low.astype(np.float32), shown.high.astype(np.float32), shown.shape, np.float32
            )
            self._low = shown.low.astype(np.float64)
            self._high = shown.high.astype(np.float64)
        else:
            raise ConfigError(f"env: {cfg.id!r} action space {act_space} is not Discrete or Box")
        self._pool: Any = None
        self._fresh = False
        """True while the pool has been built and not yet reset or stepped (so reset(seed) may reuse it)."""
        self._seed: int | None = None
        self._all_ids = np.arange(num_envs, dtype=np.int32)

    @property
    def num_threads(self) -> int:
        """EnvPool worker threads this slot's pool uses."""
        return int(self._options["num_threads"])

    def _build(self, seed: int) -> None:
        """A fresh pool seeded with ``seed`` (EnvPool seeds env ``i`` from ``seed`` and ``i``), replacing the old
        one."""
        self.close()
        try:
            self._pool = self._envpool.make(
                self.task,
                env_type="gymnasium",
                num_envs=self.num_envs,
                batch_size=self.num_envs,
                seed=int(seed),
                **self._options,
            )
        except Exception as exc:
            raise ConfigError(f"env: cannot create EnvPool {self.task!r}: {type(exc).__name__}: {exc}") from None
        self._seed = seed
        self._fresh = True

    def reset(self, seed: int) -> Observation:
        """Reset every environment; the same seed gives the same episodes.

        EnvPool seeds only at construction, so a used pool is rebuilt rather than
        reset. Nothing is ever in flight here (the pool is synchronous), so the
        full reset cannot race a step.
        """
        if self._pool is None or not self._fresh or self._seed != seed:
            self._build(seed)
        self._fresh = False
        obs, info = self._pool.reset()
        out = np.empty_like(obs)
        out[info["env_id"]] = obs
        return {OBS: out}

    def _actions(self, actions: np.ndarray) -> np.ndarray:
        """Actions in EnvPool's dtype (int32 / float64); Box actions clipped to the bounds, as ClipToBox does."""
        if self._low is None:
            return np.asarray(actions).astype(np.int32, copy=False).reshape(self.num_envs)
        a = np.asarray(actions, dtype=np.float64).reshape((self.num_envs, *self._low.shape))
        return np.clip(a, self._low, self._high)

    def step(self, actions: np.ndarray) -> SlotStep:
        """Step every environment once; finished ones are reset within this call."""
        if self._pool is None:
            raise RuntimeError("EnvPoolSlot.step before reset")
        self._fresh = False
        acts = self._actions(actions)
        obs, reward, terminated, truncated, info = self._pool.step(acts)
        game_over = info.get("terminated")
        env_id = info["env_id"]
        if not np.array_equal(env_id, self._all_ids):  # a synchronous pool answers in id order; never seen otherwise
            order = np.argsort(env_id)
            obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
            game_over = None if game_over is None else game_over[order]
        terminated = terminated.astype(bool, copy=False)
        truncated = truncated.astype(bool, copy=False)
        done = terminated | truncated
        final_obs = None
        if self.atari:
            # A lost life is `terminated` (episodic life); the game is over only when ALE says so.
            episode_end = truncated | game_over.astype(bool)
        else:
            episode_end = done
        if done.any():
            ids = np.flatnonzero(done).astype(np.int32)
            if truncated.any():
                final_obs = {OBS: np.zeros_like(obs)}
                final_obs[OBS][truncated] = obs[truncated]
            # EnvPool resets a done env on its next step and ignores that step's action: take that step now,
            # for the done ids only, so obs is the next policy input as in GymSlot.
            dummy = np.zeros((len(ids), *acts.shape[1:]), dtype=acts.dtype)
            reset_obs, *_, reset_info = self._pool.step(dummy, ids)
            obs[reset_info["env_id"]] = reset_obs
        return SlotStep(
            {OBS: obs}, reward.astype(np.float32, copy=False), terminated, truncated, episode_end, final_obs
        )

    def close(self) -> None:
        """Release the pool (its threads and environments)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
