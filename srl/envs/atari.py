"""Atari with the standard DQN/PPO preprocessing, as one factory: :func:`make_atari`.

Wrapper order, innermost first, and why:

1. the ALE env with ``frameskip=1`` and explicit sticky actions, so every
   frame-level choice below is ours and visible in the config;
2. :class:`AtariFrames`: random no-op reset, frame skip with a max over the
   last two frames (Atari sprites flicker between frames), grey, resize;
3. optional ``TimeLimit`` in *agent* steps, counted over the whole game;
4. :class:`EpisodicLife`: a lost life ends the learning episode, not the game;
   it sits outside the no-op reset so a life loss never triggers no-ops, only
   a real game reset does;
5. :class:`FireReset`: outside episodic life, so FIRE is pressed both after a
   real reset and after a lost life (Breakout stalls until the ball is served);
6. ``FrameStackObservation``: outermost, so the stack restarts on every
   learning episode and the observation is ``uint8 [frame_stack, H, W]``.

Rewards stay unclipped here: the actor clips training rewards
(``env.reward_clip``) and reports true game returns.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import ale_py
import cv2
import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box
from gymnasium.wrappers import FrameStackObservation, TimeLimit

from srl.api.env import LIFE_LOSS

__all__ = ["ALE_MAX_FRAMES", "AtariFrames", "EpisodicLife", "FireReset", "make_atari"]

ALE_MAX_FRAMES = 108_000
"""ALE's cap on one game, in emulator frames (30 minutes at 60 Hz); reaching it truncates the game."""

_NOOP = 0
"""Agent action 0 is NOOP: every game's minimal action set starts with it (checked in :class:`AtariFrames`)."""

_FIRE_RETRIES = 3
"""Resets tried when pressing FIRE ends the episode at once (rare); bounded so reset always returns."""

Step = tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]


def _register_ale() -> None:
    """Make the ``ALE/...`` ids known to Gymnasium (ale-py no longer registers on import)."""
    gym.register_envs(ale_py)


def _ale_lives(env: gym.Env) -> int:
    """Lives left in the emulated game, read from the emulator itself."""
    return int(env.unwrapped.ale.lives())  # type: ignore[attr-defined]


class AtariFrames(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """No-op reset, frame skip with a max over the last two frames, grey and resize, on the emulator directly.

    It drives ``ale.act`` itself instead of stepping the Gymnasium env once per
    frame: that path renders an observation and crosses two Python wrappers on
    every frame, which made a Pong step about 1.6x slower. Sticky actions are
    still applied, inside ALE. Observations are ``uint8 [screen_size, screen_size]``.
    """

    def __init__(self, env: gym.Env[np.ndarray, int], *, noop_max: int, frame_skip: int, screen_size: int) -> None:
        super().__init__(env)
        _check_settings(noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size)
        if _action_meanings(env)[0] != "NOOP":
            raise ValueError(f"action 0 of {env.spec.id if env.spec else env} is not NOOP")
        self._ale = env.unwrapped.ale  # type: ignore[attr-defined]
        self._actions = self._ale.getMinimalActionSet()
        self._noop_max = noop_max
        self._skip = frame_skip
        self._size = (screen_size, screen_size)
        height, width = self._ale.getScreenDims()
        self._last = np.zeros((height, width), dtype=np.uint8)
        self._prev = np.zeros((height, width), dtype=np.uint8)
        self.observation_space = Box(0, 255, shape=self._size, dtype=np.uint8)

    def step(self, action: int) -> Step:
        """Repeat ``action`` for ``frame_skip`` frames (fewer if the game ends) and sum the rewards."""
        ale_action = self._actions[action]
        reward = 0.0
        frames = 0
        while frames < self._skip and not self._ale.game_over():
            reward += self._ale.act(ale_action)
            frames += 1
            if frames == self._skip - 1:
                self._ale.getScreenGrayscale(self._prev)
        terminated = self._ale.game_over(with_truncation=False)
        truncated = self._ale.game_truncated() and not terminated
        # Pool only over two frames of this step; a game that ended early shows its last screen.
        return self._observe(pool=frames == self._skip), reward, terminated, truncated, self._info()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the game, then wait a random 1..noop_max frames so starts differ."""
        self.env.reset(seed=seed, options=options)
        noops = int(self.env.unwrapped.np_random.integers(1, self._noop_max + 1)) if self._noop_max else 0
        for _ in range(noops):
            self._ale.act(ale_py.Action.NOOP)
            if self._ale.game_over():
                self._ale.reset_game()
        return self._observe(pool=False), self._info()

    def _observe(self, pool: bool) -> np.ndarray:
        """The current screen (max-pooled with the previous frame when ``pool``), grey and resized."""
        self._ale.getScreenGrayscale(self._last)
        if pool and self._skip > 1:
            np.maximum(self._last, self._prev, out=self._last)
        return cv2.resize(self._last, self._size, interpolation=cv2.INTER_AREA)

    def _info(self) -> dict[str, Any]:
        """Lives and the frame count of this game, as the ALE env reports them."""
        return {"lives": self._ale.lives(), "episode_frame_number": self._ale.getEpisodeFrameNumber()}


def _check_settings(*, noop_max: int, frame_skip: int, screen_size: int) -> None:
    """Reject impossible settings naming the argument (the env factory turns this into a config error)."""
    if noop_max < 0:
        raise ValueError(f"noop_max must be >= 0, got {noop_max}")
    for name, value in (("frame_skip", frame_skip), ("screen_size", screen_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


class EpisodicLife(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """End the learning episode on every lost life, but keep playing the same game.

    Treating a lost life as terminal gives the value function a strong signal
    that dying is bad. The step that loses a life returns ``terminated=True``
    and ``info[LIFE_LOSS] = True`` so slots can tell it from a real game end
    (which never carries the key) and report whole-game returns. The next
    :meth:`reset` then takes one no-op step instead of resetting the emulator.
    """

    def __init__(self, env: gym.Env[np.ndarray, int]) -> None:
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def step(self, action: int) -> Step:
        """Step the game; flag a life loss unless the game itself ended on this step."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = bool(terminated or truncated)
        lives = _ale_lives(self.env)
        if lives < self._lives and not self._game_over:
            terminated = True
            info = {**info, LIFE_LOSS: True}
        self._lives = lives
        return obs, reward, terminated, truncated, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the emulator only when the game is over (or a seed asks for a fresh start)."""
        if self._game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, info = self._continue_game()
        self._game_over = False
        self._lives = _ale_lives(self.env)
        return obs, info

    def _continue_game(self) -> tuple[np.ndarray, dict[str, Any]]:
        """One no-op step after a lost life; a real reset if that step happens to end the game."""
        obs, _, terminated, truncated, info = self.env.step(_NOOP)
        if terminated or truncated:
            return self.env.reset()
        return obs, info


class FireReset(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """Press FIRE after every reset, for games that wait for it to start or to serve.

    Without it a fresh policy can sit forever on a frozen screen (Breakout
    serves the ball only on FIRE), wasting samples. The FIRE step's reward is
    dropped, as it is part of the reset.
    """

    def __init__(self, env: gym.Env[np.ndarray, int]) -> None:
        super().__init__(env)
        self._fire = _action_meanings(env).index("FIRE")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset, then FIRE; if FIRE ends the episode at once, reset and try again."""
        obs, info = self.env.reset(seed=seed, options=options)
        for _ in range(_FIRE_RETRIES):
            obs, _, terminated, truncated, info = self.env.step(self._fire)
            if not (terminated or truncated):
                break
            obs, info = self.env.reset()
        return obs, info


def _action_meanings(env: gym.Env) -> list[str]:
    """The game's action names (minimal action set), e.g. ``['NOOP', 'FIRE', 'RIGHT', 'LEFT']``."""
    return list(env.unwrapped.get_action_meanings())  # type: ignore[attr-defined]


def make_atari(
    env_id: str,
    *,
    noop_max: int = 30,
    frame_skip: int = 4,
    screen_size: int = 84,
    frame_stack: int = 4,
    episodic_life: bool = True,
    fire_reset: bool = True,
    repeat_action_probability: float = 0.25,
    max_episode_steps: int | None = None,
) -> gym.Env:
    """One preprocessed Atari env: ``uint8 [frame_stack, screen_size, screen_size]`` observations.

    ``env_id`` is a Gymnasium ALE id such as ``"ALE/Pong-v5"``. Sticky actions
    default to 0.25, Gymnasium v5's value (Machado et al. 2018), and are set
    explicitly because the emulator runs with ``frameskip=1`` under our own
    frame skip. ``max_episode_steps`` counts agent steps (after frame skip)
    over a whole game, across lives, including the FIRE and no-op steps that
    follow a reset; independently, ALE truncates any game at
    :data:`ALE_MAX_FRAMES` emulator frames.
    """
    _register_ale()
    # Grey: only reset renders through the env (AtariFrames reads the screen itself), and grey is the cheaper copy.
    env: gym.Env = gym.make(
        env_id,
        frameskip=1,
        repeat_action_probability=repeat_action_probability,
        obs_type="grayscale",
        max_num_frames_per_episode=ALE_MAX_FRAMES,
    )
    env = AtariFrames(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size)
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps)
    if episodic_life:
        env = EpisodicLife(env)
    if fire_reset and "FIRE" in _action_meanings(env):
        env = FireReset(env)
    return FrameStackObservation(env, frame_stack)
