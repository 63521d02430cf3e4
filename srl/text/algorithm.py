"""PPO and GRPO over the tokens of a causal language model (``algorithm: lm_ppo``), and its acting policy.

The workload is ordinary to the system: a text task (:mod:`srl.text.task`) is a slot whose observation is a
prompt's ids and whose action is a whole completion, so actors, policy workers (which generate), the sample
stream, the parameter service and the trainer carry it like any other run. A segment holds ``T`` batches of
``B`` completions; the policy declares two fields besides the actions: ``logp`` (each token's behaviour
log-prob, ``[C]``) and ``length`` (the completion's tokens, its end included).

The trainer keeps three networks:

- the policy, whose parameters alone are published (flat, float32) to the generators;
- a frozen reference (``text.reference``, else the starting model) for the KL leash, unless
  ``text.reference_on: generator`` puts it beside the generator, which then sends each token's reference
  log-prob in the sample (``ref_logp``);
- with ``text.advantage: gae``, a critic: its own copy of the starting model's trunk with a scalar head,
  trained here and never shipped (the decentralized critic of SRL); its value at a token is read from the
  hidden state that predicted the token, the state before it was chosen.

An update recomputes, with no gradient, the current (proximal) log-probs, the reference's and the values
(the first minibatch's proximal log-probs come from its own forward where nothing needs them earlier); then
it takes ``ppo.epochs`` passes of ``ppo.minibatches`` minibatches of completions through the clipped
surrogate of :func:`srl.algorithms.ppo_math.ppo_loss` over the valid tokens. The critic shares no parameter
with the policy, so its passes (the values, and its forward and backward in each minibatch) run on a thread
of their own beside the policy's (``text.critic_thread``): the same numbers, in about the policy's time.
With ``ppo.td_compensation`` (asynchronous generation, bounded by ``ppo.max_policy_lag``) the ratio is taken
against the proximal policy and each token weighted by its truncated importance weight against the behaviour
policy (decoupled PPO); without it, against the behaviour log-probs, which synchronous generation makes equal
to the proximal ones.
The math is in :mod:`srl.algorithms.token_math`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from srl.algorithms.acting import TensorActing
from srl.algorithms.adam import Adam, scheduled_lr
from srl.algorithms.grad_clip import GradClipper, clip_all
from srl.algorithms.ppo_math import ppo_loss, value_loss
from srl.algorithms.token_math import (
    group_advantages,
    kl_penalty,
    kl_per_token,
    lengths_mask,
    masked_mean,
    masked_whiten,
    token_gae,
    token_rewards,
)
from srl.api.algorithm import AlgorithmContext
from srl.api.config import ConfigError, ExperimentConfig, PPOConfig
from srl.api.device import autocast, field, torch_device
from srl.api.schema import Field
from srl.api.spaces import OBS
from srl.api.worker import TrainResult
from srl.nets.flat import FlatState
from srl.text.generate import (
    StopStrings,
    completion_logits,
    completion_logp,
    completion_outputs,
    generate,
    token_logp,
)
from srl.text.hf import CausalLM, ModelError, load_lm, load_tokenizer
from srl.text.pretrain import ensure_base
from srl.text.reward_model import ensure_reward_model
from srl.text.reward_stage import NAME as REWARD_STAGE


def prompt_mask(ids: Tensor, pad_id: int) -> Tensor:
    """1 from each row's first non-pad token on (prompts are left-padded; a pad inside a prompt stays real)."""
    return ((ids != pad_id).long().cumsum(dim=1) > 0).long()


def _context(model: CausalLM) -> int | None:
    config = model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def _load(folder: str | None, where: str) -> CausalLM:
    if folder is None:
        raise ConfigError(f"{where}: algorithm lm_ppo needs a model folder")
    try:
        return load_lm(folder, where)
    except ModelError as exc:
        raise ConfigError(str(exc)) from None


def _task_settings(cfg: ExperimentConfig, action_space: spaces.Space) -> tuple[int, tuple[str, ...], int]:
    """The completion budget, the stop strings and GRPO's group size, from the text task's settings (checked
    against the estimator and the slot size: the plan calls this, so a mismatch is one line before any start)."""
    if not isinstance(action_space, spaces.MultiDiscrete):
        raise ConfigError(f"algorithm: lm_ppo needs a text task as env (env.id {cfg.env.id!r} is not one)")
    kwargs = cfg.env.kwargs
    group = int(kwargs.get("group_size", 1))
    if cfg.text.advantage == "group" and group < 2:
        raise ConfigError(
            f"text.advantage: group (GRPO) compares completions of one prompt: needs env.kwargs.group_size >= 2, "
            f"got {group}"
        )
    on_stage = kwargs.get("reward_on", "actor") == "stage"
    if on_stage != (cfg.stage.worker == REWARD_STAGE):
        raise ConfigError(
            f"env.kwargs.reward_on: {'stage' if on_stage else 'actor'} goes with "
            f"{'stage.worker: ' + REWARD_STAGE if on_stage else 'no reward worker'}; stage.worker is "
            f"{cfg.stage.worker!r} (the reward worker scores in place of the actors, never beside them)"
        )
    if on_stage and (cfg.env.normalize_reward or cfg.env.reward_clip is not None):
        raise ConfigError(
            "env.kwargs.reward_on: stage: the actors never see the rewards, so they cannot scale or clip them "
            "(env.normalize_reward, env.reward_clip)"
        )
    if cfg.workers.envs_per_slot % group:
        raise ConfigError(
            f"workers.envs_per_slot: {cfg.workers.envs_per_slot} completions per slot do not split into groups of "
            f"env.kwargs.group_size {group}"
        )
    return len(action_space.nvec), tuple(kwargs.get("stop", ())), group


def _check_fits(
    model: CausalLM, tokenizer: Any, obs_space: spaces.Space, action_space: spaces.Space, max_new: int, where: str
) -> None:
    task_vocab = int(action_space.nvec[0])  # type: ignore[attr-defined]  # a text task's MultiDiscrete
    if task_vocab != len(tokenizer):
        raise ConfigError(
            f"env.kwargs.tokenizer: the task's tokenizer has {task_vocab} tokens, the one of {where} {len(tokenizer)} "
            "(the task and the model must share a tokenizer)"
        )
    vocab = int(model.config.vocab_size)
    if len(tokenizer) > vocab:
        raise ConfigError(f"{where}: the tokenizer has {len(tokenizer)} tokens, the model only {vocab}")
    context = _context(model)
    prompt = int(obs_space.shape[0]) if obs_space.shape else 0
    if context is not None and prompt + max_new > context:
        raise ConfigError(
            f"env.kwargs.max_new_tokens: prompts of up to {prompt} tokens and completions of up to {max_new} "
            f"exceed the context of {where} ({context} positions)"
        )


class TextPolicy(TensorActing):
    """Generates completions for a batch of prompts (what actors and policy workers run): the actions are the
    completion tokens, with each token's log-prob and the completion's length; given a frozen ``reference``, also
    each token's log-prob under it (``ref_logp``, ``text.reference_on: generator``), for sampled completions."""

    def __init__(
        self,
        model: CausalLM,
        tokenizer: Any,
        max_new_tokens: int,
        stop: tuple[str, ...],
        cfg: Any,
        reference: CausalLM | None = None,
    ) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.reference = None if reference is None else reference.eval().requires_grad_(False)
        self.params = list(self.model.parameters())  # what a snapshot carries (tied weights once)
        self._flat = FlatState(self.params)
        self.max_new_tokens, self.cfg = max_new_tokens, cfg
        self.vocab = len(tokenizer)
        self.pad_id, self.eos_id = int(tokenizer.pad_token_id), int(tokenizer.eos_token_id)
        self.stop = StopStrings(tokenizer, stop)

    def output_fields(self) -> tuple[Field, ...]:
        fields: tuple[Field, ...] = (Field("logp", (self.max_new_tokens,), "float32"), Field("length", (), "int32"))
        if self.reference is not None:
            fields += (Field("ref_logp", (self.max_new_tokens,), "float32"),)
        return fields

    measure_batches = False
    """A forward pass is a whole generation, whose length depends on the prompts: a policy worker keeps
    ``max_inference_batch`` as its cap instead of measuring one (``srl.system.policy_worker``)."""

    def to_device(self, device: torch.device) -> None:
        """Generate on ``device`` (a policy worker's ``workers.policy_device``), the reference beside the model."""
        self.device = device
        self.model.to(device)
        if self.reference is not None:
            self.reference.to(device)

    def act_tensors(self, obs: Mapping[str, Tensor], deterministic: bool = False) -> dict[str, Tensor]:
        """Completions of the prompts ``obs[OBS]`` (token ids, left-padded) on the model's device."""
        ids = obs[OBS].long()
        pmask = prompt_mask(ids, self.pad_id)
        out = generate(
            self.model,
            ids,
            pmask,
            self.max_new_tokens,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            greedy=deterministic,
            stop=self.stop,
            vocab=self.vocab,
        )
        result = {"actions": out.tokens, "logp": out.logp, "length": out.lengths.to(torch.int32)}
        if self.reference is not None and not deterministic:  # greedy play (eval) keeps only the actions
            mask = lengths_mask(out.lengths, out.tokens.shape[1])
            with torch.no_grad():
                ref = completion_logp(self.reference, ids, pmask, out.tokens, mask, self.cfg.temperature, self.vocab)
            result["ref_logp"] = ref
        return result

    def load_flat(self, flat: np.ndarray) -> None:
        self._flat.unpack(self.params, flat)

    def flat_size(self) -> int:
        return self._flat.size

    def flat_state(self, out: np.ndarray | None = None) -> np.ndarray:
        return self._flat.pack(self.params, out)


class ValueModel(nn.Module):
    """A critic over completions: a language model's trunk (its own copy) and a scalar head per position."""

    def __init__(self, lm: CausalLM, init_std: float) -> None:
        super().__init__()
        self.trunk: CausalLM = lm.base_model
        width = int(lm.config.hidden_size)
        self.head = nn.Linear(width, 1)
        nn.init.normal_(self.head.weight, std=init_std) if init_std > 0 else nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
        """Values ``[N, C]``: at each completion token, of the state before it was chosen."""
        states = completion_outputs(self.trunk, prompt_ids, prompt_mask, tokens, mask, "last_hidden_state")
        return self.head(states).squeeze(-1)


class LMPPO:
    """PPO (with a critic) or GRPO (group-relative, no critic) over tokens; see the module docstring."""

    section: ClassVar[str] = "ppo"
    reads: ClassVar[tuple[str, ...]] = ("text",)
    settings: ClassVar[type] = PPOConfig
    on_policy: ClassVar[bool] = True
    trainer_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16")

    fuse_first_minibatch = True
    """Take the first minibatch's proximal log-probs from its own training forward (the weights have not moved
    yet) instead of the no-grad pass. False changes no number, it costs one more partial pass (tests compare)."""

    def __init__(self, ctx: AlgorithmContext) -> None:
        cfg = ctx.cfg
        torch.manual_seed(ctx.seed)
        self.ppo: PPOConfig = ctx.args
        self.text = cfg.text
        self.collective = ctx.collective
        self.device = torch_device(ctx.device, "trainer device")
        self.dtype = cfg.workers.trainer_dtype  # bfloat16: the forward passes under autocast
        max_new, _, self.group_size = _task_settings(cfg, ctx.action_space)
        tokenizer = _tokenizer(cfg)
        self.pad_id, self.vocab = int(tokenizer.pad_token_id), len(tokenizer)
        self.policy = _load(self.text.model, "text.model")
        _check_fits(self.policy, tokenizer, ctx.obs_space, ctx.action_space, max_new, "text.model")
        self.policy.eval().to(self.device)  # no dropout: the ratio of a completion must not depend on a random mask
        self.reference = _reference(cfg) if self.text.reference_on == "trainer" else None
        if self.reference is not None:
            self.reference.to(self.device)
        self.critic: ValueModel | None = None
        params = {"policy": list(self.policy.parameters())}
        if self.text.advantage == "gae":
            self.critic = ValueModel(_load(self.text.model, "text.model"), self.text.value_head_init)
            self.critic.eval().to(self.device)
            params["critic"] = list(self.critic.parameters())
        self._critic_pool = (
            ThreadPoolExecutor(1, thread_name_prefix="srl-critic")
            if self.critic is not None and self.text.critic_thread
            else None
        )
        self.optimizer = Adam([p for group in params.values() for p in group], lr=self.ppo.lr, eps=self.ppo.adam_eps)
        self._clippers = {
            name: GradClipper(
                group,
                self.ppo.max_grad_norm,
                adaptive=self.ppo.grad_clip == "adaptive",
                percentile=self.ppo.grad_clip_percentile,
                window=self.ppo.grad_clip_window,
                unitwise=self.ppo.unitwise_clip,
            )
            for name, group in params.items()
        }
        self._policy_params = params["policy"]
        self._policy_flat = FlatState(self._policy_params)
        self._gen = torch.Generator().manual_seed(ctx.seed + 1)
        self._t_first: float | None = None
        self._tokens = self._tokens_first = 0.0

    @staticmethod
    def prepare(cfg: ExperimentConfig) -> None:
        """The pipeline's first steps, each done once and cached: a missing base model is made (``text.base``),
        then a missing reward model, from the base model's samples (``text.reward_model``)."""
        ensure_base(cfg)
        ensure_reward_model(cfg)

    @staticmethod
    def acting_policy(ctx: AlgorithmContext) -> TextPolicy:
        """The generator: the starting model (every snapshot then overwrites its weights) and its tokenizer."""
        max_new, stop, _ = _task_settings(ctx.cfg, ctx.action_space)
        model = _load(ctx.cfg.text.model, "text.model")
        tokenizer = _tokenizer(ctx.cfg)
        _check_fits(model, tokenizer, ctx.obs_space, ctx.action_space, max_new, "text.model")
        reference = _reference(ctx.cfg) if ctx.cfg.text.reference_on == "generator" else None
        return TextPolicy(model, tokenizer, max_new, stop, ctx.cfg.text, reference)

    # ------------------------------------------------------------------ Algorithm
    def policy_state(self) -> np.ndarray:
        return self._policy_flat.pack(self._policy_params, None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "critic": None if self.critic is None else self.critic.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "minibatches": self._gen.get_state()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        self._gen.set_state(state["rng"]["minibatches"])

    def synchronize(self) -> None:
        if self.collective is not None:
            self.collective.broadcast_([p.data for p in self._policy_params])

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        t0 = time.perf_counter()
        ppo, text = self.ppo, self.text
        self.optimizer.lr = lr = scheduled_lr(ppo.lr, ppo.lr_schedule, progress)
        T, N = batch["rewards"].shape
        rows = T * N
        device = self.device
        prompts = field(batch, OBS, device)[:T].reshape(rows, -1).long()
        pmask = prompt_mask(prompts, self.pad_id)  # each pass trims its rows' padding (completion_outputs)
        tokens = field(batch, "actions", device).reshape(rows, -1).long()
        C = tokens.shape[1]
        mask = lengths_mask(field(batch, "length", device).reshape(rows).long(), C)
        behaviour = field(batch, "logp", device).reshape(rows, C)
        scores = field(batch, "rewards", device).reshape(rows)
        mb = max(1, rows // ppo.minibatches)
        perms = [torch.randperm(rows, generator=self._gen).to(device) for _ in range(ppo.epochs)]
        # the proximal log-probs are the policy's before this update. A no-grad pass takes them, except for the
        # first minibatch's rows when nothing before the loop needs them: its own forward, at the same weights,
        # gives them then (with one minibatch and one epoch there is no extra pass at all)
        upfront = (text.kl_coef > 0 and text.kl_in == "reward") or (self.critic is not None and ppo.vtrace_targets)
        first = None if upfront or not self.fuse_first_minibatch else perms[0][:mb]
        kl_reward = text.kl_coef if text.kl_in == "reward" else 0.0
        # the critic's values start on its thread (text.critic_thread) while the policy's pass runs here
        critic_values = None if self.critic is None else self._beside(self._values, prompts, pmask, tokens, mask, mb)
        with torch.no_grad():  # the batch as the current policy, the reference and the critic see it
            prox = torch.zeros(rows, C, device=device)
            todo = torch.ones(rows, dtype=torch.bool, device=device)
            if first is not None:
                todo[first] = False
            rest = todo.nonzero().squeeze(1)
            for s in _chunks(len(rest), mb):
                prox[rest[s]] = self._logp(self.policy, prompts, pmask, tokens, mask, rest[s])
            ref: Tensor | None = None
            if "ref_logp" in batch:  # taken by the generator (text.reference_on: generator)
                ref = field(batch, "ref_logp", device).reshape(rows, C)
            elif self.reference is not None:
                ref = torch.cat(
                    [self._logp(self.reference, prompts, pmask, tokens, mask, s) for s in _chunks(rows, mb)]
                )
            values = returns = None
            if critic_values is not None:
                values = critic_values()
                rho = c = None
                if ppo.vtrace_targets:
                    ratio = (prox - behaviour).exp()
                    rho, c = ratio.clamp(max=ppo.is_rho_clip), ratio.clamp(max=ppo.is_c_clip)
                kl = _kl(prox, ref, mask, text.estimator) if kl_reward else torch.zeros_like(prox)
                rewards = token_rewards(scores, kl, mask, kl_reward)
                adv, returns = token_gae(rewards, values, mask, ppo.gamma, ppo.gae_lambda, rho, c)
                if ppo.normalize_advantages:
                    adv = masked_whiten(adv, mask)
            else:
                sequence = scores - kl_reward * _kl(prox, ref, mask, text.estimator).sum(dim=1) if kl_reward else scores
                adv = group_advantages(sequence, self.group_size, text.group_scale)[:, None] * mask

        update = _Update(prompts, pmask, tokens, mask, behaviour, prox, adv, values, returns, ref)
        sums: dict[str, float] = {}
        count = 0
        for epoch, perm in enumerate(perms):
            for start in range(0, mb * ppo.minibatches, mb):
                fresh = epoch == 0 and start == 0 and first is not None
                stats = self._minibatch(perm[start : start + mb], fresh, update)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        ratio = (prox - behaviour).exp()  # every row's proximal log-probs are known now
        kl = _kl(prox, ref, mask, text.estimator)
        out = {k: v / count for k, v in sums.items()}
        lengths = mask.sum(dim=1)
        trained = float(lengths.sum())
        self._tokens += trained
        now = time.perf_counter()
        if self._t_first is None:  # the rate counts from the end of the first update: batches made after it
            self._t_first, self._tokens_first = now, self._tokens
        out.update(
            reward=float(scores.mean()),
            kl=float(kl.sum(dim=1).mean()),
            response_length=float(lengths.mean()),
            tokens_trained=trained,
            # this update's training throughput, and completion tokens generated and trained per second of wall
            # time since the first update (the whole pipeline's rate: generation bounds it when training keeps up)
            train_tokens_per_second=trained / max(now - t0, 1e-9),
            tokens_per_second=(self._tokens - self._tokens_first) / max(now - self._t_first, 1e-9),
            is_weight_mean=float(masked_mean(ratio, mask)),
            is_weight_truncated=float(masked_mean((ratio > ppo.is_rho_clip).float(), mask)),
            lr=lr,
        )
        if self.collective is not None:
            out["bytes_reduced"] = float(self.collective.bytes_reduced)
            out["seconds_reduced"] = float(self.collective.seconds_reduced)
        return TrainResult(out)

    # ------------------------------------------------------------------ internals
    def _logp(
        self, model: CausalLM, prompts: Tensor, pmask: Tensor, tokens: Tensor, mask: Tensor, s: slice | Tensor
    ) -> Tensor:
        with autocast(self.device, self.dtype):
            logp = completion_logp(model, prompts[s], pmask[s], tokens[s], mask[s], self.text.temperature, self.vocab)
        return logp.float()

    def _minibatch(self, idx: Tensor, fresh: bool, u: _Update) -> dict[str, float]:
        """One optimizer step on the rows ``idx``. ``fresh``: the weights have not moved since the update began,
        so this forward's log-probs are the rows' proximal ones (``u.prox`` gets them)."""
        self.optimizer.zero_grad()
        critic = None  # the critic's forward and backward, on its thread (text.critic_thread) beside the policy's
        if self.critic is not None and u.values is not None and u.returns is not None:
            critic = self._beside(self._critic_step, idx, u)
        try:
            stats = self._policy_step(idx, fresh, u)
        finally:  # never leave the critic's thread running into the next step
            critic_loss = None if critic is None else critic()
        if critic_loss is not None:
            stats["value_loss"] = critic_loss
        if self.collective is not None:
            self.collective.mean_([p.grad for p in self._policy_params if p.grad is not None])
        out = {k: float(v) for k, v in stats.items()}
        out.update(clip_all(self._clippers))
        self.optimizer.step()
        return out

    def _policy_step(self, idx: Tensor, fresh: bool, u: _Update) -> dict[str, Tensor]:
        """The policy's share of one minibatch: its forward, the clipped surrogate (and the KL leash in the loss)
        and its backward; the detached stats."""
        ppo, text = self.ppo, self.text
        m = u.mask[idx]
        valid = m.bool()
        with autocast(self.device, self.dtype):
            logits = completion_logits(self.policy, u.prompts[idx], u.pmask[idx], u.tokens[idx], m)
            logp, entropy = token_logp(logits, u.tokens[idx], text.temperature, self.vocab)
        logp, entropy = logp.float(), entropy.float()
        if fresh:
            u.prox[idx] = logp.detach() * m
        weights = old_logp = None
        if ppo.td_compensation:  # decoupled PPO: the ratio against the proximal policy, weighted by its IS ratio
            old_logp = u.prox[idx][valid]
            weights = (old_logp - u.behaviour[idx][valid]).exp().clamp(max=ppo.is_rho_clip)
        else:
            old_logp = u.behaviour[idx][valid]
        loss, stats = ppo_loss(
            logp[valid],
            old_logp,
            u.adv[idx][valid],
            None,  # the critic's loss is its own (_critic_step): no parameter is shared, the gradients are the same
            None,
            None,
            entropy[valid],
            clip=ppo.clip,
            value_clip=ppo.value_clip,
            vf_coef=ppo.vf_coef,
            ent_coef=ppo.ent_coef,
            weights=weights,
        )
        if text.kl_in == "loss" and u.ref is not None:
            leash = kl_penalty(logp, u.ref[idx], m, text.kl_coef, text.estimator)
            loss = loss + leash
            stats["kl_loss"] = leash.detach()
        loss.backward()
        return stats

    def _critic_step(self, idx: Tensor, u: _Update) -> Tensor:
        """The critic's share of one minibatch: its forward, the value loss and its backward (the critic's own
        gradients); the detached value loss."""
        m = u.mask[idx]
        valid = m.bool()
        critic, values, returns = self.critic, u.values, u.returns
        assert critic is not None and values is not None and returns is not None
        with autocast(self.device, self.dtype):  # on the critic's thread: autocast is per thread
            new_v = critic(u.prompts[idx], u.pmask[idx], u.tokens[idx], m)[valid].float()
        loss = value_loss(new_v, values[idx][valid], returns[idx][valid], self.ppo.value_clip)
        (self.ppo.vf_coef * loss).backward()
        return loss.detach()

    def _values(self, prompts: Tensor, pmask: Tensor, tokens: Tensor, mask: Tensor, chunk: int) -> Tensor:
        """The critic's values of every row ``[N, C]``, ``chunk`` rows a pass, with no gradient (grad mode is per
        thread: this may run on the critic's)."""
        critic = self.critic
        assert critic is not None
        with torch.no_grad(), autocast(self.device, self.dtype):
            values = [critic(*_rows((prompts, pmask, tokens, mask), s)) for s in _chunks(len(prompts), chunk)]
        return torch.cat(values).float()

    def _beside(self, fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        """Start ``fn(*args)`` on the critic's thread and return what waits for its result; without the thread
        (``text.critic_thread: false``), run it here and now."""
        if self._critic_pool is None:
            result = fn(*args)
            return lambda: result
        return self._critic_pool.submit(fn, *args).result


@dataclass
class _Update:
    """One update's batch as its minibatches read it, each tensor by row (``[N, ...]``): the prompts (left-padded)
    and their mask, the completions and their mask, the behaviour and proximal log-probs, the advantages, and
    where there are any the critic's values and returns (PPO) and the reference's log-probs (a KL leash)."""

    prompts: Tensor
    pmask: Tensor
    tokens: Tensor
    mask: Tensor
    behaviour: Tensor
    prox: Tensor
    adv: Tensor
    values: Tensor | None
    returns: Tensor | None
    ref: Tensor | None


def _reference(cfg: ExperimentConfig) -> CausalLM | None:
    """The frozen model of the KL leash (None without one: ``text.kl_coef`` 0)."""
    text = cfg.text
    if text.kl_coef == 0:
        return None
    where = "text.reference" if text.reference else "text.model"
    return _load(text.reference or text.model, where).eval().requires_grad_(False)


def _tokenizer(cfg: ExperimentConfig) -> Any:
    folder = cfg.text.model
    if folder is None:
        raise ConfigError("text.model: algorithm lm_ppo needs a model folder")
    try:
        return load_tokenizer(folder)
    except ModelError as exc:
        raise ConfigError(str(exc)) from None


def _kl(prox: Tensor, ref: Tensor | None, mask: Tensor, estimator: Literal["k1", "k2", "k3"]) -> Tensor:
    """The per-token KL estimate to the reference ``[N, C]`` (0 without a leash)."""
    return torch.zeros_like(prox) if ref is None else kl_per_token(prox, ref, estimator) * mask


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _rows(tensors: tuple[Tensor, ...], s: slice) -> tuple[Tensor, ...]:
    return tuple(t[s] for t in tensors)
