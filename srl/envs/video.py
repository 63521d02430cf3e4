"""Video of an evaluation: the frames of one environment's first episode, and the MP4 they make.

Why a film of the env and not of the slot: a slot resets a finished episode within the step that ended it
(Gymnasium's same-step autoreset; the multi-agent and turn-based slots alike), so from the slot's side an
episode's last state is never on screen: not a game's winning move, not the pole's fall. A :class:`Film`
wraps the first environment itself (``watch`` of :func:`srl.envs.slots.make_grouped`) and renders it after
its first reset and after each of its steps until that episode ends.

Frames come from Gymnasium and PettingZoo envs made with ``render_mode="rgb_array"``, from VMAS's
``render(mode="rgb_array")`` and from the ALE's emulator screen. OpenSpiel games and text tasks have no image:
:func:`recording_env` refuses them before anything is played.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError, EnvConfig
from srl.api.env import LIFE_LOSS
from srl.api.plugins import resolve
from srl.envs.factory import create_env, takes
from srl.envs.multiagent import is_parallel_env
from srl.envs.turns import is_aec_env, is_openspiel_game
from srl.envs.vmas_slot import is_vmas_env
from srl.text.task import TextTask

DEFAULT_FPS = 30
"""Frames per second of an env that names no ``render_fps`` in its metadata."""

ALE_FPS = 15
"""The ALE's: one frame per agent step, a step being 4 emulator frames at 60 Hz."""


def recording_env(cfg: EnvConfig) -> EnvConfig:
    """``cfg`` as a filmed evaluation makes it: Gymnasium's backend (EnvPool renders nothing) and
    ``render_mode="rgb_array"`` for an env that renders on that condition (not the ALE, whose screen is read,
    nor VMAS, which renders on request). One line, before anything is played, for an env with no image or a
    factory that cannot be asked for one."""
    _headless_sdl()
    cfg = dataclasses.replace(cfg, backend="gymnasium")
    if cfg.id.startswith("ALE/") or (":" in cfg.id and not _needs_render_mode(cfg)):
        return cfg
    return dataclasses.replace(cfg, kwargs={**cfg.kwargs, "render_mode": "rgb_array"})


def _headless_sdl() -> None:
    """Rendering into an array needs neither a display nor a sound device, but pygame's SDL looks for both
    when an env starts it, and where there are none (a server, a container) it prints ``error:
    XDG_RUNTIME_DIR is invalid ...`` and ALSA's complaints on a run that succeeds. SDL's dummy drivers look for
    nothing; a user's own ``SDL_VIDEODRIVER`` and ``SDL_AUDIODRIVER`` are kept."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def _needs_render_mode(cfg: EnvConfig) -> bool:
    """Whether the factory ``cfg.id`` (``package.module:attr``) gets ``render_mode``: its env is one of
    Gymnasium or PettingZoo that does not render into arrays already, and it takes the argument. Which kind it
    makes is known once one is made."""
    made = create_env(cfg)
    try:
        if isinstance(made, TextTask):
            raise ConfigError(f"--video: env {cfg.id!r} is a text task, which has no frames (see its samples)")
        if is_openspiel_game(made):
            raise ConfigError(f"--video: env {cfg.id!r} is an OpenSpiel game; OpenSpiel draws no images")
        if is_vmas_env(made) or getattr(made, "render_mode", None) == "rgb_array":
            return False
    finally:
        close = getattr(made, "close", None)
        if callable(close):
            close()
    if not takes(resolve(cfg.id, {}, "env.id"), "render_mode", any_keyword=True):
        raise ConfigError(
            f"--video: the env factory {cfg.id} takes no render_mode; accept render_mode='rgb_array' "
            "(and pass it to the env) to record video"
        )
    return True


class Film:
    """The frames of one environment's first episode: after its first reset and after each of its steps, the
    step that ends the episode included; :meth:`watch` wraps the env so that it reports them."""

    def __init__(self, name: str) -> None:
        """``name``: the env's id, for the error lines."""
        self.name = name
        self.frames: list[np.ndarray] = []
        self.fps: float = DEFAULT_FPS
        self._rolling = False

    def watch(self, env: Any) -> Any:
        """``env`` wrapped to report its frames here; it keeps its kind (Gymnasium, PettingZoo, VMAS)."""
        if isinstance(env, gym.Env):
            self.fps = ALE_FPS if _ale(env) is not None else env.metadata.get("render_fps") or DEFAULT_FPS
            return _GymFilm(env, self)
        if is_parallel_env(env) or is_aec_env(env):
            from srl.envs.video_pettingzoo import filmed  # PettingZoo is an optional dependency

            self.fps = env.metadata.get("render_fps") or DEFAULT_FPS
            return filmed(env, self)
        if is_vmas_env(env):
            return _VmasFilm(env, self)
        raise ConfigError(f"--video: env {self.name!r} has no frames to record")

    def reset(self, render: Callable[[], Any]) -> None:
        """The env was reset: the first time, its first episode starts; later resets are past the film's end."""
        if not self.frames:
            self._rolling = True
            self._take(render)

    def step(self, render: Callable[[], Any], ended: bool) -> None:
        """The env made a step; ``ended``: the step ended the episode (its frame is the film's last)."""
        if self._rolling:
            self._take(render)
            self._rolling = not ended

    def _take(self, render: Callable[[], Any]) -> None:
        try:
            frame = render()
        except Exception as exc:  # a missing renderer (pygame, OpenGL) raises many types
            raise ConfigError(f"--video: env {self.name!r} cannot render: {type(exc).__name__}: {exc}") from None
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] not in (3, 4):
            raise ConfigError(
                f"--video: env {self.name!r} rendered {type(frame).__name__}, not an RGB image (its render() "
                "must return one when made with render_mode='rgb_array')"
            )
        self.frames.append(np.array(frame[..., :3]))  # a copy: a renderer may hand out its own buffer


def _ale(env: gym.Env) -> Any:
    """The ALE emulator under ``env``, or None."""
    return getattr(env.unwrapped, "ale", None)


class _GymFilm(gym.Wrapper):
    """A Gymnasium env that reports its frames to a :class:`Film`; an Atari life loss does not end the game."""

    def __init__(self, env: gym.Env, film: Film) -> None:
        super().__init__(env)
        self._film = film

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        out = self.env.reset(seed=seed, options=options)
        self._film.reset(self._screen)
        return out

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._film.step(self._screen, bool(terminated or truncated) and not info.get(LIFE_LOSS, False))
        return obs, reward, terminated, truncated, info

    def _screen(self) -> Any:
        ale = _ale(self.env)
        return np.asarray(ale.getScreenRGB()) if ale is not None else self.env.render()


class _VmasFilm:
    """A VMAS env whose world 0 reports its frames to a :class:`Film`. VMAS has no wrapper class, and its slot
    only calls the env's methods and reads its attributes, so a proxy serves."""

    def __init__(self, env: Any, film: Film) -> None:
        self._env, self._film = env, film

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        out = self._env.reset(*args, **kwargs)
        self._film.reset(self._screen)
        return out

    def step(self, actions: Any) -> Any:
        out = self._env.step(actions)
        done = out[2] | out[3] if len(out) == 5 else out[2]  # terminated | truncated, or done
        self._film.step(self._screen, bool(done[0]))
        return out

    def _screen(self) -> Any:
        return self._env.render(mode="rgb_array", env_index=0)


def write_mp4(path: Path, frames: list[np.ndarray], fps: float) -> int:
    """Write ``frames`` to ``path`` as H.264 MP4, atomically (a reader never sees half a video); how many. With
    no frames nothing is written, and the line says so."""
    if not frames:
        raise ConfigError(f"--video: the env gave no frames; {path} not written")
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise ConfigError("--video needs imageio and imageio-ffmpeg: pip install -e '.[video]'") from None
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.mp4")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with imageio.get_writer(
            tmp, fps=fps, codec="libx264", quality=7, macro_block_size=2, ffmpeg_log_level="error"
        ) as writer:
            for frame in frames:
                writer.append_data(_even(frame))  # type: ignore[attr-defined]
        tmp.replace(path)
    except OSError as exc:  # a folder that cannot be made, a full disk
        raise ConfigError(f"--video: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return len(frames)


def _even(frame: np.ndarray) -> np.ndarray:
    """``frame`` with an even height and width (H.264's 4:2:0 colour needs them), its edge repeated where odd."""
    h, w = frame.shape[:2]
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge") if h % 2 or w % 2 else frame
