"""PettingZoo envs that report their frames to a :class:`Film` (``srl.envs.video``'s), in a module of their own
because PettingZoo is an optional dependency. The wrappers are PettingZoo's own kinds, so a filmed AEC env is
still one to the turn-based slot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pettingzoo.utils import BaseParallelWrapper, BaseWrapper

from srl.envs.turns import is_aec_env


class Film(Protocol):
    """What the wrappers report to: each reset and each step, with the env's ``render``."""

    def reset(self, render: Callable[[], Any]) -> None: ...

    def step(self, render: Callable[[], Any], ended: bool) -> None: ...


class _ParallelFilm(BaseParallelWrapper):
    def __init__(self, env: Any, film: Film) -> None:
        super().__init__(env)
        self.film = film

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        out = self.env.reset(seed=seed, options=options)
        self.film.reset(self.env.render)
        return out

    def step(self, actions: dict[Any, Any]) -> Any:
        out = self.env.step(actions)
        self.film.step(self.env.render, not self.env.agents)  # the episode ends when every agent is done
        return out


class _AecFilm(BaseWrapper):
    def __init__(self, env: Any, film: Film) -> None:
        super().__init__(env)
        self.film = film

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self.film.reset(self.env.render)

    def step(self, action: Any) -> None:
        self.env.step(action)
        if action is not None:  # a done agent's step (PettingZoo's dead step) shows nothing new
            env = self.env
            self.film.step(env.render, all(env.terminations[a] or env.truncations[a] for a in env.agents))


def filmed(env: Any, film: Film) -> Any:
    """A PettingZoo ``ParallelEnv`` or ``AECEnv`` that reports its frames to ``film``."""
    return _AecFilm(env, film) if is_aec_env(env) else _ParallelFilm(env, film)
