"""A text task as an actor slot: each environment is one prompt, each episode one completion.

``env.id: srl.text.task:TextTask`` with ``env.kwargs`` (all checked here, each error one line naming its key):

- ``tokenizer``: a local model folder whose tokenizer turns prompts into ids (the policy's model folder);
- ``prompts``: a JSONL file of ``{"prompt": "..."}`` lines, or ``module:function`` with
  ``function(rng: numpy.random.Generator, split: str, **prompt_args) -> str`` drawing one prompt (``split`` is
  ``train`` or ``eval``, so a generator can keep held-out prompts apart; ``prompt_args`` are its own settings);
  ``eval_prompts``: a second file for evaluation;
- ``reward``: ``module:function`` with ``function(prompts: list[str], completions: list[str]) -> list[float]``,
  or a class built once with ``reward_args`` whose instances are such functions (a reward model:
  ``srl.text.reward_model:RewardModelScorer`` with ``reward_args: {folder: ...}``);
- ``max_prompt_tokens`` (P) and ``max_new_tokens`` (C): the observation is a prompt's ids, left-padded to P
  with the tokenizer's pad id; the action is a completion of up to C tokens (``MultiDiscrete([V] * C)``);
- ``group_size`` (G): each drawn training prompt fills G consecutive environments of a slot (GRPO's group);
- ``stop``: strings that end a completion (the generating policy stops there; the reward function sees the
  completion up to, not including, the first stop string);
- ``split``: ``train`` (default) or ``eval`` (held-out prompts; set by evaluation);
- ``reward_on``: ``actor`` (default: each slot scores its own completions) or ``stage``: a reward worker
  (``stage.worker: srl.text.reward_stage:RewardStage``) scores every actor's completions between the actors and
  the trainers, with one copy of the reward (a reward model) per node instead of one per slot. The actors' tasks
  then neither build the reward nor report returns (the worker reports them); evaluation scores in place.

One step answers the whole slot: the completions of its B prompts are decoded (up to their end-of-sequence
token), scored by one call of the reward function, and every environment is done (``terminated``) and shows
a fresh prompt. The return of an episode is its completion's reward.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError, EnvConfig
from srl.api.env import SlotStep
from srl.api.spaces import OBS, Observation

SPLITS = ("train", "eval")
REWARD_ON = ("actor", "stage")
PromptFn = Callable[..., str]
RewardFn = Callable[[list[str], list[str]], Sequence[float]]


def evaluation_env(cfg: EnvConfig) -> EnvConfig:
    """``cfg`` as evaluation builds it: a text task answers its held-out prompts (``split: eval``); any other env
    is unchanged."""
    if ":" not in cfg.id or cfg.kwargs.get("split") == "eval":
        return cfg
    from srl.api.plugins import resolve

    try:
        factory = resolve(cfg.id, {}, "env.id")
    except ConfigError:
        return cfg  # the env's own construction reports it
    if isinstance(factory, type) and issubclass(factory, TextTask):
        return dataclasses.replace(cfg, kwargs={**cfg.kwargs, "split": "eval"})
    return cfg


class TaskError(RuntimeError):
    """The task's own code (a prompt generator, the reward function) misbehaved; the message names it."""


def _resolve(spec: Any, key: str) -> Any:
    from srl.api.plugins import resolve

    if not isinstance(spec, str):
        raise ConfigError(f"env.kwargs.{key}: expected 'package.module:function', got {spec!r}")
    return resolve(spec, {}, f"env.kwargs.{key}")


def read_prompts(path: str | Path, key: str = "prompts") -> list[str]:
    """The prompts of a JSONL file (one ``{"prompt": str}`` object per line; blank lines skipped)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"env.kwargs.{key}: prompt file {str(p)!r} does not exist")
    out = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"env.kwargs.{key}: {str(p)!r} line {n}: not JSON ({exc.msg})") from None
            prompt = row.get("prompt") if isinstance(row, dict) else None
            if not isinstance(prompt, str) or not prompt:
                raise ConfigError(f"env.kwargs.{key}: {str(p)!r} line {n}: expected an object with a 'prompt' string")
            out.append(prompt)
    if not out:
        raise ConfigError(f"env.kwargs.{key}: prompt file {str(p)!r} has no prompts")
    return out


class PromptSource:
    """Draws prompts for one slot: a file's prompts in a fresh shuffled order each pass, or a generator's."""

    def __init__(self, spec: Any, key: str, split: str, args: Mapping[str, Any] | None = None) -> None:
        self.split, self.key, self.args = split, key, dict(args or {})
        self.fn: PromptFn | None = None
        self.fixed: list[str] | None = None
        if isinstance(spec, str) and spec.endswith(".jsonl"):
            self.fixed = read_prompts(spec, key)
        elif isinstance(spec, str) and ":" in spec:
            self.fn = _resolve(spec, key)
        else:
            raise ConfigError(f"env.kwargs.{key}: expected a .jsonl file or 'package.module:function', got {spec!r}")
        self.rng = np.random.default_rng(0)
        self._order: list[int] = []

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self._order = []

    def draw(self, n: int) -> list[str]:
        if self.fixed is not None:
            out = []
            for _ in range(n):
                if not self._order:
                    self._order = self.rng.permutation(len(self.fixed)).tolist()
                out.append(self.fixed[self._order.pop()])
            return out
        assert self.fn is not None
        prompts = []
        for _ in range(n):
            try:
                prompt = self.fn(self.rng, self.split, **self.args)
            except Exception as exc:
                raise TaskError(
                    f"env.kwargs.{self.key}: the prompt generator raised {type(exc).__name__}: {exc}"
                ) from None
            if not isinstance(prompt, str) or not prompt:
                raise TaskError(f"env.kwargs.{self.key}: the prompt generator returned {prompt!r}, not a non-empty str")
            prompts.append(prompt)
        return prompts


class TextTask:
    """``num_envs`` prompts answered together (see the module docstring); a native batched slot."""

    agents_per_env = 1
    state_space: gym.spaces.Space | None = None

    def __init__(
        self,
        num_envs: int = 1,
        *,
        tokenizer: str | None = None,
        prompts: Any = None,
        reward: Any = None,
        max_prompt_tokens: int = 64,
        max_new_tokens: int = 32,
        group_size: int = 1,
        stop: Sequence[str] = (),
        eval_prompts: Any = None,
        prompt_args: Mapping[str, Any] | None = None,
        reward_args: Mapping[str, Any] | None = None,
        split: str = "train",
        reward_on: str = "actor",
    ) -> None:
        from srl.text.hf import ModelError, load_tokenizer

        for key, value in (("tokenizer", tokenizer), ("prompts", prompts), ("reward", reward)):
            if value is None:
                raise ConfigError(f"env.kwargs.{key}: a text task needs one")
        for key, value in (("max_prompt_tokens", max_prompt_tokens), ("max_new_tokens", max_new_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"env.kwargs.{key}: must be an integer >= 1, got {value!r}")
        if not isinstance(group_size, int) or group_size < 1:
            raise ConfigError(f"env.kwargs.group_size: must be an integer >= 1, got {group_size!r}")
        if split not in SPLITS:
            raise ConfigError(f"env.kwargs.split: expected train or eval, got {split!r}")
        if reward_on not in REWARD_ON:
            raise ConfigError(f"env.kwargs.reward_on: expected actor or stage, got {reward_on!r}")
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise ConfigError(f"env.kwargs.stop: expected a list of non-empty strings, got {stop!r}")
        assert tokenizer is not None  # checked above
        try:
            self.tokenizer = load_tokenizer(tokenizer, "env.kwargs.tokenizer")
        except ModelError as exc:
            raise ConfigError(str(exc)) from None
        # Held-out prompts are each answered once; training draws groups (a slot whose size is no multiple of
        # the group size, as when probing with one env, cuts its last group short; trainers of a group
        # estimator check that theirs split evenly).
        self.num_envs, self.group_size, self.split = num_envs, group_size if split == "train" else 1, split
        self.max_prompt_tokens, self.max_new_tokens = max_prompt_tokens, max_new_tokens
        self.stop = tuple(stop)
        self.pad_id, self.eos_id = int(self.tokenizer.pad_token_id), int(self.tokenizer.eos_token_id)
        key = "eval_prompts" if split == "eval" and eval_prompts is not None else "prompts"
        if prompt_args is not None and not isinstance(prompt_args, Mapping):
            raise ConfigError(f"env.kwargs.prompt_args: expected a mapping, got {prompt_args!r}")
        self.source = PromptSource(eval_prompts if key == "eval_prompts" else prompts, key, split, prompt_args)
        if self.source.fixed is not None:  # a file is checked whole, before anything runs
            self._encode(self.source.fixed, where=f"prompt file {prompts if key == 'prompts' else eval_prompts!r}")
        if reward_args is not None and not isinstance(reward_args, Mapping):
            raise ConfigError(f"env.kwargs.reward_args: expected a mapping, got {reward_args!r}")
        fn = _resolve(reward, "reward")
        # training completions scored downstream (a reward worker): the name is checked, nothing is built here
        self.deferred_rewards = reward_on == "stage" and split == "train"
        if isinstance(fn, type) and not self.deferred_rewards:
            try:
                fn = fn(**(reward_args or {}))
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(
                    f"env.kwargs.reward: {reward} could not be built: {type(exc).__name__}: {exc}"
                ) from None
        elif reward_args:
            fn = functools.partial(fn, **reward_args)
        self.reward_fn: RewardFn = fn
        self.reward_name = reward
        vocab = len(self.tokenizer)
        self.single_observation_space: gym.spaces.Space = gym.spaces.Box(0, vocab - 1, (max_prompt_tokens,), np.int32)
        completion = np.full(max_new_tokens, vocab, dtype=np.int64)
        self.single_action_space: gym.spaces.Space = gym.spaces.MultiDiscrete(completion)
        self.prompts: list[str] = []
        self._obs = np.full((num_envs, max_prompt_tokens), self.pad_id, np.int32)

    def _encode(self, prompts: Sequence[str], where: str = "a generated prompt") -> list[list[int]]:
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        for i, row in enumerate(ids):
            if len(row) > self.max_prompt_tokens:
                raise ConfigError(
                    f"env.kwargs.max_prompt_tokens: {where}: prompt {i + 1} ({prompts[i][:40]!r}) is {len(row)} "
                    f"tokens, longer than {self.max_prompt_tokens}"
                )
            if not row:
                raise ConfigError(f"env.kwargs.prompts: {where}: prompt {i + 1} has no tokens")
        return ids

    def _draw(self) -> Observation:
        G, B = self.group_size, self.num_envs
        unique = self.source.draw(-(-B // G))
        try:
            ids = self._encode(unique)
        except ConfigError as exc:
            raise TaskError(str(exc)) from None
        self.prompts = [p for p in unique for _ in range(G)][:B]
        self._obs.fill(self.pad_id)
        for i, row in enumerate(ids):
            self._obs[i * G : (i + 1) * G, self.max_prompt_tokens - len(row) :] = row
        return {OBS: self._obs.copy()}

    def reset(self, seed: int) -> Observation:
        self.source.seed(seed)
        return self._draw()

    def completions(self, tokens: np.ndarray) -> list[str]:
        """The text of each completion: its tokens before the end-of-sequence (or pad) token, cut before the
        first stop string."""
        rows = []
        for row in tokens.tolist():
            end = len(row)
            for j, t in enumerate(row):
                if t == self.eos_id or t == self.pad_id:
                    end = j
                    break
            rows.append(row[:end])
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        for i, text in enumerate(texts):
            cuts = [k for k in (text.find(s) for s in self.stop) if k >= 0]
            if cuts:
                texts[i] = text[: min(cuts)]
        return texts

    def prompt_texts(self, ids: np.ndarray) -> list[str]:
        """The prompts of observations ``[B, P]`` (left-padded ids) as text, for a scorer that sees only ids."""
        ids = np.asarray(ids)
        first = np.where((ids != self.pad_id).any(axis=1), (ids != self.pad_id).argmax(axis=1), ids.shape[1])
        rows = [row[k:] for row, k in zip(ids.tolist(), first.tolist())]  # the left padding off, nothing else
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def score(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        """The reward function's scores, checked: one finite number per completion."""
        name = self.reward_name
        try:
            out = self.reward_fn(prompts, completions)
        except Exception as exc:
            raise TaskError(f"env.kwargs.reward: {name} raised {type(exc).__name__}: {exc}") from None
        try:
            values = [float(v) for v in out]
        except (TypeError, ValueError):
            raise TaskError(f"env.kwargs.reward: {name} returned {type(out).__name__}, not a list of numbers") from None
        if len(values) != len(completions):
            raise TaskError(
                f"env.kwargs.reward: {name} returned {len(values)} rewards for {len(completions)} completions"
            )
        bad = next((v for v in values if not math.isfinite(v)), None)
        if bad is not None:
            raise TaskError(f"env.kwargs.reward: {name} returned a non-finite reward ({bad})")
        return np.asarray(values, np.float32)

    def step(self, actions: np.ndarray) -> SlotStep:
        if self.deferred_rewards:
            rewards = np.zeros(self.num_envs, np.float32)  # the reward worker writes them into the segment
        else:
            rewards = self.score(self.prompts, self.completions(np.asarray(actions)))
        done = np.ones(self.num_envs, bool)
        return SlotStep(self._draw(), rewards, done, np.zeros(self.num_envs, bool), done, None)

    def close(self) -> None:
        pass
