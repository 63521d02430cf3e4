"""Peer baseline: TRL's ``PPOTrainer`` (``trl.experimental.ppo``) on srl's preference task (``rlhf_preference``).

Written for this project. It trains the same pre-trained Llama (``models/pydoc_lm``) against the same
Bradley-Terry reward model (``models/pydoc_rm``), with a critic and a per-token KL penalty to the frozen
starting model, on the same prompts (``srl.text.preference.prompts``), and it scores every sampled
completion by the hidden oracle too (``srl.text.preference.oracle``), so that srl and TRL can be compared
side by side. See ``TRL.md`` beside this file for the venv and the command lines.

TRL 1.13 and later have no PPO: ``PPOTrainer`` lived in ``trl.experimental.ppo`` up to TRL 1.12.0 and was
then removed. This script needs ``trl==1.12.0`` (the venv in ``TRL.md``), and stops with a message under
any other TRL that lacks it.

Settings mirrored from ``configs/rlhf_preference.yaml`` (and srl's ``ppo`` and ``text`` defaults):

- 64 completions per update (``per_device_train_batch_size`` 64, ``gradient_accumulation_steps`` 1), one per
  prompt; ``num_ppo_epochs`` 2 and ``num_mini_batches`` 2 (so 4 optimizer steps of 32 completions per
  update); ``--total-episodes`` completions in all (srl's ``run.total_env_steps``: 15000);
- prompts of at most 48 tokens (``env.kwargs.max_prompt_tokens``, checked), ``response_length`` 24
  (``max_new_tokens``), temperature 1.0, top_k off, top_p 1.0, stop at ``<eos>`` (``stop_token="eos"``);
- rewards: the reward model's score of prompt + completion + ``<eos>`` at the completion's end, and
  ``-kl_coef * kl`` on every token, ``kl_coef`` 0.05, the k1 estimator ``logp - ref_logp`` against the frozen
  starting model (``text.kl_in: reward``); no reward whitening, no missing-eos penalty;
- GAE with gamma 1.0, lambda 0.95; advantages whitened over the whole batch's valid tokens (srl's
  ``ppo.normalize_advantages`` does the same over the batch);
- clipped surrogate, clip 0.2; value loss ``0.5 * mean((v - return)^2)`` with weight ``vf_coef`` 0.5 (srl's
  default), and no value clipping (srl's ``value_clip: null``; TRL always clips, so ``cliprange_value`` is
  set to 1e9, where the clipped and unclipped terms are equal); no entropy bonus;
- the critic: its own copy of ``models/pydoc_lm``'s trunk with a ``Linear(width, 1)`` head, weight and bias
  zero (srl's ``ValueModel`` with ``text.value_head_init: 0``), read at the state that predicted each token;
- one Adam over policy and critic (AdamW with weight decay 0), lr 1e-4 constant, betas (0.9, 0.999), eps
  1e-5 (srl's ``ppo.adam_eps``), and gradient-norm clipping at 1.0 for the policy's and the critic's
  gradients separately (srl's ``ppo.max_grad_norm`` with its per-network clippers). TRL's PPO clips nothing
  (it ignores ``max_grad_norm``), so the script passes its own optimizer, which clips each of its two
  parameter groups before the Adam step; ``--max-grad-norm 0`` gives TRL's own behaviour;
- CPU, fp32, 2 torch threads, no dropout (TRL disables it), no gradient checkpointing, no reporting
  (``report_to="none"``), no saving, no sample generations, the hub offline (``HF_HUB_OFFLINE=1``,
  ``local_files_only``).

Instrumentation: TRL's PPO ``train()`` is one loop, so the script wraps two functions of the trainer's
module that the loop calls: ``batch_generation`` (timed: this is the generation time) and ``get_reward``
(when called with the reward model, it keeps the completions, their scores and lengths, and scores the
decoded completions by the oracle; that time is left out of both ``gen_s`` and ``train_s``).

Output (``--out``, JSONL): an optional ``"eval": "initial"`` line, one line per PPO update, a ``"eval":
"final"`` line, then a summary line (``"summary": true``). Each update line has

- ``wall_s`` (seconds since the process started), ``train_wall_s`` (since the training loop began),
  ``update`` (1, 2, ...), ``episodes`` (completions so far);
- ``rm_score`` (mean reward-model score of this update's 64 completions, the score PPO maximizes),
  ``oracle`` (mean oracle score of the same completions, decoded as srl decodes them), ``kl`` (TRL's
  ``objective/kl``: the k1 KL summed over each completion's tokens, averaged over completions, as srl's
  ``kl``), ``entropy`` (TRL's ``policy/entropy_avg``: the mean per-token entropy of the policy over the
  minibatches it trained on, as srl's ``entropy``), ``entropy_sampled`` (TRL's ``objective/entropy``: the
  summed ``-logp`` of the sampled tokens per completion), ``response_length`` (mean completion length in
  tokens, ``<eos>`` included, as srl's ``response_length``), ``eos_fraction`` (completions that ended by
  ``<eos>`` within 24 tokens);
- ``gen_tokens`` (this update's completion tokens, ``<eos>`` included: what srl counts), ``gen_positions``
  (all generated positions, the padding after ``<eos>`` included), ``trained_tokens`` (the completion
  tokens of the batch, counted once per update, as srl's ``tokens_trained``), ``step_s``, ``gen_s`` (time in
  ``batch_generation``: ``model.generate`` over the batch), ``measure_s`` (decoding and the oracle, for the
  log only), ``train_s`` (the rest: the reference, critic and reward-model forwards, GAE, the two epochs of
  minibatches with backward and optimizer steps), ``gen_tokens_per_s`` (``gen_tokens / gen_s``),
  ``trained_tokens_per_s`` (``trained_tokens / train_s``), ``grad_norm_policy`` and ``grad_norm_critic``
  (before clipping, at the update's last optimizer step);
- TRL's own metrics under ``trl/`` (``objective/scores``, ``objective/rlhf_reward``, ``loss/policy_avg``,
  ``loss/value_avg``, ``policy/approxkl_avg``, ``policy/clipfrac_avg``, ``val/clipfrac_avg``, ...).

An eval line scores greedy completions of ``--eval-prompts`` (256) held-out prompts
(``prompts(rng, "eval")`` with ``rng = default_rng(--eval-seed)``), as srl's evaluation does (greedy, the
eval split): ``rm_score``, ``oracle``, ``response_length``, ``eval_s``. The summary line has ``updates``,
``episodes``, ``total_wall_s``, ``train_loop_s``, ``gen_s``, ``train_s``, ``measure_s``, ``gen_tokens``,
``trained_tokens``, ``gen_tokens_per_s`` (generated tokens per second of the training loop's wall time),
``gen_tokens_per_s_after_first`` (the same counted from the end of the first update, as srl's
``tokens_per_second``), ``gen_tokens_per_gen_s`` (per second spent generating), ``trained_tokens_per_s``
(per second of ``train_s``), ``s_per_update`` (mean, after the first), ``rm_score_last10`` and
``oracle_last10`` (means of the last 10 updates), and the TRL version.

``--generate-only`` measures the ceiling: ``model.generate`` alone on 64 left-padded prompts, 24 new
tokens, sampled as TRL's PPO samples, ``--repeats`` times after one warm-up call; it prints one JSON line.
``--check-rm`` prints the reward-model wrapper's scores (through TRL's ``get_reward``) of fixed prompt and
completion strings, to compare with ``srl.text.reward_model.RewardModelScorer`` (see ``TRL.md``).
"""

from __future__ import annotations

from peer_env import (  # first: the clock starts, the hubs go offline, the repository joins sys.path
    REPO,
    T0,
    time_generate,
)

# isort: split
import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from srl.text import preference

BATCH = 64  # completions per update (workers.batch_segments x envs_per_slot)
HEAD = "score_head.safetensors"  # srl.text.reward_model.HEAD
NO_VALUE_CLIP = 1e9  # TRL always clips the value loss; this wide a range never binds

CHECK_CASES = [  # --check-rm: (prompt, completion), the same strings srl's scorer is given
    ("The following ", "example shows the use of the function."),
    ("If the object ", "is a class, the method is called"),
    ("This is ", ""),
    ("Return a new ", "list of the items in the sequence, in order, and the values of th"),
    ("Changed in ", "version 3.3: the argument"),
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models/pydoc_lm"), help="policy, reference and critic trunk")
    p.add_argument("--reward-model", default=str(REPO / "models/pydoc_rm"), help="srl reward-model folder")
    p.add_argument("--out", default="runs/peers/trl_ppo_preference.jsonl", help="JSONL log (training mode)")
    p.add_argument("--total-episodes", type=int, default=15_000, help="completions in all (run.total_env_steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=int, default=None, help="training prompts in the dataset (default: episodes)")
    p.add_argument("--max-new", type=int, default=24, help="max completion tokens (env.kwargs.max_new_tokens)")
    p.add_argument("--max-prompt-tokens", type=int, default=48, help="env.kwargs.max_prompt_tokens (checked)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=2, help="ppo.epochs")
    p.add_argument("--minibatches", type=int, default=2, help="ppo.minibatches")
    p.add_argument("--vf-coef", type=float, default=0.5, help="ppo.vf_coef (srl's default; TRL's is 0.1)")
    p.add_argument(
        "--value-clip", type=float, default=None, help="ppo.value_clip; default none (TRL's own default is 0.2)"
    )
    p.add_argument(
        "--max-grad-norm", type=float, default=1.0, help="per-network grad-norm clip (ppo.max_grad_norm); 0: none"
    )
    p.add_argument(
        "--rm-append-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="score a completion cut at --max-new tokens with <eos> after it, as srl's scorer does "
        "(--no-rm-append-eos: TRL's way, at its last token)",
    )
    p.add_argument("--eval-prompts", type=int, default=256, help="greedy eval prompts (run.eval_episodes); 0: none")
    p.add_argument("--eval-seed", type=int, default=999_984, help="eval prompts' seed (srl's eval_seed for seed 1)")
    p.add_argument("--no-eval-initial", action="store_true", help="skip the eval before training")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after the update that passes this wall time")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--generate-only", action="store_true", help="time model.generate alone and exit")
    p.add_argument("--repeats", type=int, default=20, help="--generate-only: timed generate calls")
    p.add_argument("--check-rm", action="store_true", help="print the RM wrapper's scores of fixed strings and exit")
    return p.parse_args()


# ------------------------------------------------------------------------------------------------ models
def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True, padding_side="left")
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1, (tok.pad_token_id, tok.eos_token_id)
    probe = "The following "  # the byte-level tokenizer adds no special tokens: as srl's add_special_tokens=False
    assert tok(probe)["input_ids"] == tok(probe, add_special_tokens=False)["input_ids"]
    return tok


class Trunk(nn.Module):
    """A transformers trunk (``AutoModel``) as TRL's ``get_reward`` calls it, optionally ending each row with
    ``<eos>``, as srl's ``RewardModelScorer`` scores every completion (completion + ``<eos>``, read at the
    ``<eos>``). A row is left pads, the prompt, the completion, right pads; it ends where ``get_reward``
    reads it, before the first pad after its first real token. A row whose last token there is not
    ``eos_id`` (a completion cut at the token budget, or one that sampled the pad token) is run with an
    ``<eos>`` after it, and that ``<eos>``'s hidden state is returned at the row's last column."""

    def __init__(self, model: nn.Module, eos_id: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.eos_id = eos_id

    def forward(self, input_ids, attention_mask, position_ids=None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutput

        mask = attention_mask.long()
        N, L = input_ids.shape
        dev = input_ids.device
        cols, rows = torch.arange(L, device=dev), torch.arange(N, device=dev)
        start = mask.argmax(dim=1)  # first real column: the prompt's first token
        gap = (cols[None] > start[:, None]) & (mask == 0)
        last = torch.where(gap.any(dim=1), gap.int().argmax(dim=1), L) - 1  # get_reward's sequence_lengths
        need = torch.zeros(N, dtype=torch.bool, device=dev)
        if self.eos_id is not None:
            need = input_ids[rows, last] != self.eos_id
        if need.any():
            input_ids = torch.cat([input_ids, torch.zeros_like(input_ids[:, :1])], dim=1)
            mask = torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)
            mask = mask * (torch.arange(L + 1, device=dev)[None] <= last[:, None])  # nothing after the end
            r = rows[need]
            input_ids[r, last[need] + 1] = self.eos_id
            mask[r, last[need] + 1] = 1
        position_ids = mask.cumsum(1) - mask  # srl's positions(): 0 at each row's first real token
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False, return_dict=True
        )
        states = out.last_hidden_state
        if need.any():
            states = states.clone()
            r = rows[need]
            states[r, last[need]] = states[r, last[need] + 1]
            states = states[:, :L]
        # TRL 1.12's get_reward reads hidden_states[-1]; later versions read last_hidden_state: both are given
        return BaseModelOutput(last_hidden_state=states, hidden_states=(states,))


class ScoredTrunk(nn.Module):
    """The interface of TRL's reward and value models: ``getattr(m, m.base_model_prefix)`` is a trunk and
    ``m.score`` maps its hidden states ``[N, L, H]`` to ``[N, L, 1]``."""

    base_model_prefix = "trunk"

    def __init__(self, trunk: nn.Module, width: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.score = nn.Linear(width, 1)

    @property
    def config(self):  # what some of TRL's helpers look at
        inner = self.trunk.model if isinstance(self.trunk, Trunk) else self.trunk
        return inner.config


def load_reward_model(folder: str, append_eos: bool, eos_id: int) -> ScoredTrunk:
    """srl's reward-model folder: the trunk (``save_pretrained``) and the head (``score_head.safetensors``:
    ``weight [1, width]``, ``bias [1]``)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    trunk = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    model = ScoredTrunk(Trunk(trunk, eos_id if append_eos else None), int(trunk.config.hidden_size))
    model.score.load_state_dict(load_file(str(Path(folder) / HEAD)))
    return model.eval()


def load_value_model(folder: str) -> ScoredTrunk:
    """srl's critic: its own copy of the policy's trunk and a zero-initialised ``Linear(width, 1)`` head."""
    from transformers import AutoModel

    trunk = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    model = ScoredTrunk(trunk, int(trunk.config.hidden_size))
    nn.init.zeros_(model.score.weight)
    nn.init.zeros_(model.score.bias)
    return model


def load_lm(folder: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)


def get_reward_fn():
    """TRL's ``get_reward`` (where the installed version keeps it)."""
    try:
        from trl.experimental.utils import get_reward
    except ImportError:  # older layouts
        from trl.trainer.utils import get_reward
    return get_reward


@torch.no_grad()
def rm_scores(rm: ScoredTrunk, tok, prompts: list[str], completions: list[str], eos: bool = True) -> list[float]:
    """The reward model's scores of prompt + completion (+ ``<eos>`` when ``eos``) through TRL's ``get_reward``:
    left-padded prompts, then the completions right-padded, as TRL's rollout lays them out."""
    pad_id, eos_id = tok.pad_token_id, tok.eos_token_id
    p = tok(list(prompts), add_special_tokens=False)["input_ids"]
    c = [[*r, eos_id] if eos else r for r in tok(list(completions), add_special_tokens=False)["input_ids"]]
    P, C = max(map(len, p)), max(1, max(map(len, c)))
    qr = torch.full((len(p), P + C), pad_id, dtype=torch.long)
    for i, (a, b) in enumerate(zip(p, c)):
        qr[i, P - len(a) : P] = torch.tensor(a)
        if b:
            qr[i, P : P + len(b)] = torch.tensor(b)
    _, score, _ = get_reward_fn()(rm, qr, pad_id, P)
    return score.tolist()


def decode_completions(tok, responses: torch.Tensor) -> tuple[list[str], list[int]]:
    """srl's ``TextTask.completions``: each row's tokens before its first ``<eos>`` or pad, decoded; and each
    completion's length with its ``<eos>`` (srl's ``length``: all of a row without one)."""
    pad_id, eos_id = tok.pad_token_id, tok.eos_token_id
    rows, lengths = [], []
    for row in responses.tolist():
        end = next((j for j, t in enumerate(row) if t in (eos_id, pad_id)), len(row))
        rows.append(row[:end])
        lengths.append(end + 1 if end < len(row) and row[end] == eos_id else end)
    return tok.batch_decode(rows, skip_special_tokens=True), lengths


def check_prompt_lengths(tok, prompts: list[str], limit: int) -> None:
    longest = max(len(ids) for ids in tok(prompts, add_special_tokens=False)["input_ids"])
    assert longest <= limit, f"a prompt is {longest} tokens, over --max-prompt-tokens {limit}"


# ------------------------------------------------------------------------------------------- check-rm
def check_rm(args: argparse.Namespace) -> None:
    tok = load_tokenizer(args.reward_model)
    rm = load_reward_model(args.reward_model, append_eos=True, eos_id=tok.eos_token_id)
    prompts = [p for p, _ in CHECK_CASES]
    completions = [c for _, c in CHECK_CASES]
    with_eos = rm_scores(rm, tok, prompts, completions, eos=True)  # the completions as TRL hands them over
    appended = rm_scores(rm, tok, prompts, completions, eos=False)  # cut completions: the wrapper adds <eos>
    plain = load_reward_model(args.reward_model, append_eos=False, eos_id=tok.eos_token_id)
    trl_way = rm_scores(plain, tok, prompts, completions, eos=False)  # TRL's stock reading, no <eos>
    print(json.dumps({"mode": "check_rm", "cases": CHECK_CASES, "with_eos": with_eos, "eos_appended": appended,
                      "no_eos_trl_stock": trl_way}))  # fmt: skip


# ---------------------------------------------------------------------------------------- generate-only
def sampling_kwargs(tok, max_new: int) -> dict:
    """What TRL's PPO passes to ``generate`` (``PPOTrainer.train``), with the stop token it sets."""
    return dict(
        max_new_tokens=max_new,
        temperature=1.0 + 1e-7,
        top_k=0,
        top_p=1.0,
        do_sample=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )


def generate_only(args: argparse.Namespace) -> None:
    tok = load_tokenizer(args.model)
    model = load_lm(args.model).eval()
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    kwargs = sampling_kwargs(tok, args.max_new)

    def batch():
        prompts = [preference.prompts(rng, "train") for _ in range(BATCH)]
        return tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)

    record = time_generate(
        model, batch, kwargs, args.repeats, lambda c: sum(decode_completions(tok, c)[1]),
        {"rows": BATCH, "max_new": args.max_new},
    )  # fmt: skip
    print(json.dumps(record))


# ------------------------------------------------------------------------------------------------- eval
@torch.no_grad()
def evaluate(policy, rm: ScoredTrunk, tok, args: argparse.Namespace, which: str) -> dict:
    """Greedy completions of the held-out prompts, scored by the reward model and the oracle (srl's eval)."""
    t = time.perf_counter()
    was_training = policy.training
    policy.eval()
    rng = np.random.default_rng(args.eval_seed)
    prompts = [preference.prompts(rng, "eval") for _ in range(args.eval_prompts)]
    texts, lengths = [], []
    for i in range(0, len(prompts), BATCH):
        enc = tok(prompts[i : i + BATCH], return_tensors="pt", padding=True, padding_side="left")
        out = policy.generate(
            **enc,
            max_new_tokens=args.max_new,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        x, n = decode_completions(tok, out[:, enc["input_ids"].shape[1] :])
        texts += x
        lengths += n
    rm_s = []
    for i in range(0, len(prompts), BATCH):
        rm_s += rm_scores(rm, tok, prompts[i : i + BATCH], texts[i : i + BATCH])
    oracle = preference.oracle(prompts, texts)
    policy.train(was_training)
    return {
        "eval": which,
        "wall_s": round(time.perf_counter() - T0, 4),
        "episodes": len(prompts),
        "rm_score": float(np.mean(rm_s)),
        "oracle": float(np.mean(oracle)),
        "response_length": float(np.mean(lengths)),
        "eval_s": round(time.perf_counter() - t, 3),
        "example": {"prompt": prompts[0], "completion": texts[0]},
    }


# --------------------------------------------------------------------------------------------- training
class ClippedAdamW(torch.optim.AdamW):
    """AdamW that clips each parameter group's gradient norm at ``max_norm`` before its step (srl clips the
    policy's and the critic's gradients separately); ``max_norm`` 0 clips nothing."""

    def __init__(self, groups, max_norm: float, **kwargs) -> None:
        super().__init__(groups, **kwargs)
        self.max_norm = max_norm
        self.last_norms: list[float] = []

    @torch.no_grad()
    def step(self, closure=None):
        if self.max_norm > 0:
            self.last_norms = [
                float(torch.nn.utils.clip_grad_norm_([p for p in g["params"] if p.grad is not None], self.max_norm))
                for g in self.param_groups
            ]
        return super().step(closure)


class Meter:
    """Per-update counters, filled by the wrapped ``batch_generation`` and ``get_reward``, read by the callback."""

    def __init__(self) -> None:
        self.gen_s = self.measure_s = 0.0
        self.gen_tokens = self.gen_positions = 0
        self.rm: list[float] = []
        self.oracle: list[float] = []
        self.lengths: list[int] = []
        self.eos: list[bool] = []
        self.grad_norms: list[list[float]] = []
        self.totals = {"gen_s": 0.0, "measure_s": 0.0, "train_s": 0.0, "gen_tokens": 0, "trained_tokens": 0}
        self.loop_begin: float | None = None
        self.last_end: float | None = None
        self.first_end: float | None = None
        self.first_tokens = 0
        self.step_times: list[float] = []
        self.history: list[tuple[float, float]] = []  # (rm_score, oracle) per update

    def reset_update(self) -> None:
        self.gen_s = self.measure_s = 0.0
        self.gen_tokens = self.gen_positions = 0
        self.rm, self.oracle, self.lengths, self.eos, self.grad_norms = [], [], [], [], []


def instrument(module, meter: Meter, reward_model: nn.Module, tok) -> None:
    """Wrap the PPO module's ``batch_generation`` (timed) and ``get_reward`` (the reward model's calls are
    recorded: scores, lengths, oracle) where ``PPOTrainer.train`` looks them up."""
    batch_generation, get_reward = module.batch_generation, module.get_reward

    def timed_batch_generation(model, queries, *a, **kw):
        t = time.perf_counter()
        query_responses, logits = batch_generation(model, queries, *a, **kw)
        meter.gen_s += time.perf_counter() - t
        meter.gen_positions += query_responses.shape[0] * (query_responses.shape[1] - queries.shape[1])
        return query_responses, logits

    def recorded_get_reward(model, query_responses, pad_token_id, context_length):
        out = get_reward(model, query_responses, pad_token_id, context_length)
        if model is reward_model:
            t = time.perf_counter()
            texts, lengths = decode_completions(tok, query_responses[:, context_length:])
            meter.rm += out[1].tolist()
            meter.lengths += lengths
            meter.eos += (query_responses[:, context_length:] == tok.eos_token_id).any(dim=1).tolist()
            meter.gen_tokens += sum(lengths)
            meter.oracle += preference.oracle([""] * len(texts), texts)
            meter.measure_s += time.perf_counter() - t
        return out

    module.batch_generation = timed_batch_generation
    module.get_reward = recorded_get_reward


def main_train(args: argparse.Namespace) -> None:
    try:
        import trl
        from trl.experimental.ppo import PPOConfig, PPOTrainer
        from trl.experimental.ppo import ppo_trainer as ppo_module
    except ImportError as exc:
        import trl

        sys.exit(
            f"trl {trl.__version__} has no trl.experimental.ppo ({exc}); PPO was removed after TRL 1.12.0: "
            "use the venv with trl==1.12.0 (scripts/peers/TRL.md)"
        )
    from datasets import Dataset
    from transformers import TrainerCallback, set_seed
    from transformers.trainer_callback import PrinterCallback

    meter = Meter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.open("w")

    def write(line: dict) -> None:
        log.write(json.dumps(line) + "\n")
        log.flush()

    tok = load_tokenizer(args.model)
    rng = np.random.default_rng(args.seed)
    n_prompts = args.prompts or args.total_episodes
    prompts = [preference.prompts(rng, "train") for _ in range(n_prompts)]
    check_prompt_lengths(tok, prompts, args.max_prompt_tokens)
    encode = lambda rows: {"input_ids": tok(rows, add_special_tokens=False)["input_ids"]}  # noqa: E731
    dataset = Dataset.from_dict(encode(prompts))
    eval_rng = np.random.default_rng(args.eval_seed)
    eval_dataset = Dataset.from_dict(encode([preference.prompts(eval_rng, "eval") for _ in range(BATCH)]))

    # PPOTrainer does not call transformers' Trainer.__init__, which seeds; its minibatch order comes from
    # numpy's global generator (np.random.permutation), so seed random, numpy and torch here
    set_seed(args.seed)
    policy, ref = load_lm(args.model), load_lm(args.model)
    value = load_value_model(args.model)
    rm = load_reward_model(args.reward_model, args.rm_append_eos, tok.eos_token_id)
    for m in (ref, rm):
        m.eval().requires_grad_(False)

    if args.eval_prompts > 0 and not args.no_eval_initial:
        write(evaluate(policy, rm, tok, args, "initial"))

    optimizer = ClippedAdamW(
        [{"params": list(policy.parameters())}, {"params": list(value.parameters())}],
        max_norm=args.max_grad_norm,
        lr=args.lr,
        betas=(0.9, 0.999),
        eps=1e-5,
        weight_decay=0.0,
    )
    # constant LR (srl's ppo.lr_schedule: constant); TRL steps the scheduler once per update
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    instrument(ppo_module, meter, rm, tok)

    class JsonlCallback(TrainerCallback):
        def __init__(self) -> None:
            self.metrics: dict = {}

        def on_train_begin(self, a, state, control, **kw):
            meter.loop_begin = meter.last_end = time.perf_counter()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs is not None and "objective/scores" in logs:
                self.metrics = dict(logs)

        def on_step_end(self, a, state, control, **kw):
            now = time.perf_counter()
            step_s = now - meter.last_end
            train_s = step_s - meter.gen_s - meter.measure_s
            trained = sum(meter.lengths)
            tot = meter.totals
            tot["gen_s"] += meter.gen_s
            tot["measure_s"] += meter.measure_s
            tot["train_s"] += train_s
            tot["gen_tokens"] += meter.gen_tokens
            tot["trained_tokens"] += trained
            if meter.first_end is None:  # rates "after the first update" count from here (warm-up left out)
                meter.first_end, meter.first_tokens = now, tot["gen_tokens"]
            else:
                meter.step_times.append(step_s)
            meter.last_end = now
            rm_score = float(np.mean(meter.rm)) if meter.rm else float("nan")
            oracle = float(np.mean(meter.oracle)) if meter.oracle else float("nan")
            meter.history.append((rm_score, oracle))
            m = self.metrics
            line = {
                "wall_s": round(now - T0, 4),
                "train_wall_s": round(now - meter.loop_begin, 4),
                "update": state.global_step,
                "episodes": state.episode,
                "rm_score": rm_score,
                "oracle": oracle,
                "kl": m.get("objective/kl"),
                "entropy": m.get("policy/entropy_avg"),
                "entropy_sampled": m.get("objective/entropy"),
                "response_length": float(np.mean(meter.lengths)) if meter.lengths else float("nan"),
                "eos_fraction": float(np.mean(meter.eos)) if meter.eos else float("nan"),
                "gen_tokens": meter.gen_tokens,
                "gen_positions": meter.gen_positions,
                "trained_tokens": trained,
                "step_s": round(step_s, 4),
                "gen_s": round(meter.gen_s, 4),
                "measure_s": round(meter.measure_s, 4),
                "train_s": round(train_s, 4),
                "gen_tokens_per_s": round(meter.gen_tokens / max(meter.gen_s, 1e-9), 2),
                "trained_tokens_per_s": round(trained / max(train_s, 1e-9), 2),
            }
            if optimizer.last_norms:
                line["grad_norm_policy"], line["grad_norm_critic"] = optimizer.last_norms  # the update's last step
            line.update({f"trl/{k}": v for k, v in m.items() if "/" in k})
            write(line)
            self.metrics = {}
            meter.reset_update()
            if args.max_seconds is not None and now - T0 >= args.max_seconds:
                raise StopTraining  # PPOTrainer.train ignores control.should_training_stop

    config = PPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_ppo_pref_"),
        seed=args.seed,
        data_seed=args.seed,
        total_episodes=args.total_episodes,
        # batch: 64 completions per update, 2 epochs x 2 minibatches of 32
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=1,
        num_mini_batches=args.minibatches,
        num_ppo_epochs=args.epochs,
        local_rollout_forward_batch_size=BATCH,
        # generation
        response_length=args.max_new,
        temperature=1.0,
        stop_token="eos",
        missing_eos_penalty=None,
        # rewards and PPO
        kl_coef=args.kl_coef,
        kl_estimator="k1",
        whiten_rewards=False,
        gamma=1.0,
        lam=0.95,
        cliprange=0.2,
        cliprange_value=NO_VALUE_CLIP if args.value_clip is None else args.value_clip,
        vf_coef=args.vf_coef,
        # optimizer: passed in (ClippedAdamW); these say the same for the record
        learning_rate=args.lr,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=args.max_grad_norm,  # not read by TRL's PPO: ClippedAdamW clips
        # machine
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,  # TRL defaults it to True
        dataloader_num_workers=0,
        # logging and saving: none beyond this script's JSONL
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
        push_to_hub=False,
    )
    trainer = PPOTrainer(
        args=config,
        processing_class=tok,
        model=policy,
        ref_model=ref,
        reward_model=rm,
        train_dataset=dataset,
        value_model=value,
        eval_dataset=eval_dataset,
        optimizers=(optimizer, scheduler),
        callbacks=[JsonlCallback()],
    )
    trainer.remove_callback(PrinterCallback)  # it would print every update's metrics: the JSONL has them
    assert config.batch_size == BATCH and config.local_mini_batch_size == BATCH // args.minibatches
    assert trainer.args.device.type == "cpu" and not policy.is_gradient_checkpointing
    assert trainer.stop_token_id == tok.eos_token_id
    torch.set_num_threads(args.threads)
    try:
        trainer.train()
    except StopTraining:
        pass
    loop_s = time.perf_counter() - meter.loop_begin
    if args.eval_prompts > 0:
        write(evaluate(policy, rm, tok, args, "final"))
    tot = meter.totals
    last = meter.history[-10:]
    after_first = (
        round((tot["gen_tokens"] - meter.first_tokens) / max(meter.last_end - meter.first_end, 1e-9), 2)
        if meter.first_end is not None and meter.last_end > meter.first_end
        else None
    )
    summary = {
        "summary": True,
        "trl_version": trl.__version__,
        "updates": trainer.state.global_step,
        "episodes": trainer.state.episode,
        "total_wall_s": round(time.perf_counter() - T0, 3),
        "train_loop_s": round(loop_s, 3),
        "gen_s": round(tot["gen_s"], 3),
        "train_s": round(tot["train_s"], 3),
        "measure_s": round(tot["measure_s"], 3),
        "gen_tokens": tot["gen_tokens"],
        "trained_tokens": tot["trained_tokens"],
        "gen_tokens_per_s": round(tot["gen_tokens"] / loop_s, 2),
        "gen_tokens_per_s_after_first": after_first,
        "gen_tokens_per_gen_s": round(tot["gen_tokens"] / max(tot["gen_s"], 1e-9), 2),
        "trained_tokens_per_s": round(tot["trained_tokens"] / max(tot["train_s"], 1e-9), 2),
        "trained_tokens_per_s_basis": "train_s: update time outside generation and the oracle",
        "s_per_update": round(float(np.mean(meter.step_times)), 3) if meter.step_times else None,
        "rm_score_last10": float(np.mean([r for r, _ in last])) if last else None,
        "oracle_last10": float(np.mean([o for _, o in last])) if last else None,
        "completions_per_update": BATCH,
        "threads": torch.get_num_threads(),
        "max_grad_norm": args.max_grad_norm,
        "vf_coef": args.vf_coef,
        "value_clip": args.value_clip,
        "rm_append_eos": args.rm_append_eos,
    }
    assert all(math.isfinite(r) for r, _ in meter.history), "a non-finite reward-model score"
    write(summary)
    log.close()
    print(json.dumps(summary))


class StopTraining(Exception):
    """Raised by the callback at ``--max-seconds``."""


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.check_rm:
        check_rm(args)
    elif args.generate_only:
        generate_only(args)
    else:
        main_train(args)


if __name__ == "__main__":
    main()
