"""A Bradley-Terry reward model: trained here on preference pairs, then the reward of a text task.

The model is a causal LM's trunk (its own copy of the fine-tuned model's) with a scalar head read at the last
real token of prompt + completion. It is trained on pairs of completions the fine-tuned model sampled for the
task's prompts, each pair labelled by a hidden programmatic oracle (the completion it scores higher is the
chosen one; ties are dropped), with the Bradley-Terry loss ``-log sigmoid(r_chosen - r_rejected)``
(Christiano et al. 2017, Ouyang et al. 2022). A reward-model folder holds the trunk (``save_pretrained``,
safetensors), the head (``score_head.safetensors``), the tokenizer and ``srl.json`` (its held-out pair
accuracy).

As a reward: ``env.kwargs.reward: srl.text.reward_model:RewardModelScorer`` with
``env.kwargs.reward_args: {folder: ...}``; the actor scores each slot's completions in one forward pass.
The pipeline step (``text.reward_model``) makes the folder when it is missing, in a child process.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from srl.algorithms.adam import Adam
from srl.api.config import ConfigError
from srl.text.generate import completion_inputs, generate
from srl.text.hf import CausalLM, ModelError, load_lm, load_tokenizer, write_folder

log = logging.getLogger(__name__)

HEAD = "score_head.safetensors"


class RewardModel(nn.Module):
    """Scores ``[N]`` of prompt + completion pairs: a trunk and a linear head at the last real token."""

    def __init__(self, trunk: CausalLM, width: int) -> None:
        super().__init__()
        self.trunk: CausalLM = trunk
        self.head = nn.Linear(width, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
        ids, attn, pos = completion_inputs(prompt_ids, prompt_mask, tokens, mask)
        states = self.trunk(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
        last = prompt_ids.shape[1] + mask.sum(dim=1).long() - 1  # prompts are left-padded: they end at P - 1
        return self.head(states[torch.arange(len(ids)), last]).squeeze(-1)


def bradley_terry_loss(chosen: Tensor, rejected: Tensor) -> Tensor:
    """Mean ``-log sigmoid(chosen - rejected)``: the negative log-likelihood of the preferences."""
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()


def save_reward_model(model: RewardModel, tokenizer: Any, folder: str | Path, meta: dict[str, Any]) -> Path:
    """The trunk, the head and the tokenizer in ``folder`` (written atomically)."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        model.trunk.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, str(tmp / HEAD))
        (tmp / "srl.json").write_text(json.dumps(meta, indent=1) + "\n")

    return write_folder(folder, write)


def load_reward_model(folder: str | Path, where: str = "reward model") -> tuple[RewardModel, Any]:
    """A reward-model folder's model (eval mode) and tokenizer; one line when it is not one."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    path = Path(folder)
    if not (path / HEAD).is_file():
        raise ModelError(f"{where}: {str(path)!r} is not a reward-model folder (no {HEAD})")
    tokenizer = load_tokenizer(path, where)
    trunk = AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    model = RewardModel(trunk, int(trunk.config.hidden_size))
    model.head.load_state_dict(load_file(str(path / HEAD)))
    return model.eval(), tokenizer


def _encode(tokenizer: Any, prompts: Sequence[str], completions: Sequence[str]) -> tuple[Tensor, ...]:
    """Left-padded prompts and right-padded completions (each ended by the end-of-sequence token), with masks."""
    pad, eos = int(tokenizer.pad_token_id), int(tokenizer.eos_token_id)
    p = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    c = [[*row, eos] for row in tokenizer(list(completions), add_special_tokens=False)["input_ids"]]
    P, C = max(map(len, p)), max(map(len, c))
    prompt_ids = torch.full((len(p), P), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(p), P), dtype=torch.long)
    tokens = torch.full((len(c), C), pad, dtype=torch.long)
    mask = torch.zeros((len(c), C))
    for i, (a, b) in enumerate(zip(p, c)):
        prompt_ids[i, P - len(a) :], prompt_mask[i, P - len(a) :] = torch.tensor(a), 1
        tokens[i, : len(b)], mask[i, : len(b)] = torch.tensor(b), 1.0
    return prompt_ids, prompt_mask, tokens, mask


class RewardModelScorer:
    """A reward function backed by a reward-model folder: ``scorer(prompts, completions) -> list[float]``."""

    def __init__(self, folder: str) -> None:
        try:
            self.model, self.tokenizer = load_reward_model(folder, "env.kwargs.reward_args.folder")
        except ModelError as exc:
            raise ConfigError(str(exc)) from None

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        return self.model(*_encode(self.tokenizer, prompts, completions)).tolist()


def sample_pairs(
    policy: CausalLM, tokenizer: Any, prompts: list[str], max_new_tokens: int, oracle: Callable[..., Sequence[float]]
) -> tuple[list[str], list[str], list[str]]:
    """Two sampled completions per prompt, ordered by the oracle: (prompts, chosen, rejected); ties dropped."""
    pad, eos = int(tokenizer.pad_token_id), int(tokenizer.eos_token_id)
    doubled = [p for p in prompts for _ in range(2)]
    enc = tokenizer(doubled, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    out = generate(policy, enc["input_ids"], enc["attention_mask"], max_new_tokens, eos_id=eos, pad_id=pad)
    rows = [r[:n] for r, n in zip(out.tokens.tolist(), out.lengths.tolist())]
    texts = tokenizer.batch_decode([[t for t in r if t not in (pad, eos)] for r in rows])
    scores = np.asarray(oracle(doubled, texts), np.float64).reshape(-1, 2)
    keep, chosen, rejected = [], [], []
    for i, (a, b) in enumerate(scores):
        if a != b:
            keep.append(prompts[i])
            first, second = texts[2 * i], texts[2 * i + 1]
            chosen.append(first if a > b else second)
            rejected.append(second if a > b else first)
    return keep, chosen, rejected


def train_reward_model(
    policy_folder: str,
    prompt_fn: Callable[[np.random.Generator, str], str],
    oracle: Callable[..., Sequence[float]],
    folder: str,
    *,
    pairs: int,
    steps: int,
    batch_size: int,
    lr: float,
    max_new_tokens: int,
    seed: int = 0,
) -> dict[str, Any]:
    """Sample ``pairs`` preference pairs from the policy folder's model, train a reward model initialised from its
    trunk for ``steps`` steps, report its accuracy on held-out pairs (eval-split prompts), save it."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    policy, tokenizer = load_lm(policy_folder), load_tokenizer(policy_folder)
    with torch.no_grad():
        train = [sample_pairs(policy, tokenizer, [prompt_fn(rng, "train") for _ in range(256)], max_new_tokens, oracle)
                 for _ in range(-(-pairs // 256))]  # fmt: skip
        held = sample_pairs(policy, tokenizer, [prompt_fn(rng, "eval") for _ in range(512)], max_new_tokens, oracle)
    p = [x for t in train for x in t[0]]
    c = [x for t in train for x in t[1]]
    r = [x for t in train for x in t[2]]
    if not p:
        raise ValueError(
            f"the oracle tied every one of the {pairs} pairs sampled from {policy_folder}: nothing to learn"
        )
    model = RewardModel(load_lm(policy_folder).base_model, int(policy.config.hidden_size))
    model.train()
    opt = Adam(model.parameters(), lr=lr)
    for step in range(steps):
        idx = rng.integers(0, len(p), batch_size)
        batch_p = [p[i] for i in idx]
        chosen = model(*_encode(tokenizer, batch_p, [c[i] for i in idx]))
        rejected = model(*_encode(tokenizer, batch_p, [r[i] for i in idx]))
        loss = bradley_terry_loss(chosen, rejected)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0:
            log.info("reward model step %d/%d loss %.4f", step + 1, steps, float(loss.detach()))
    model.eval()
    accuracy = None  # no held-out pair the oracle tells apart
    if held[0]:
        with torch.no_grad():
            margin = model(*_encode(tokenizer, held[0], held[1])) - model(*_encode(tokenizer, held[0], held[2]))
        accuracy = float((margin > 0).float().mean())
    meta = {
        "pairs": len(p),
        "held_out_pairs": len(held[0]),
        "held_out_accuracy": accuracy,
        "steps": steps,
        "seconds": time.perf_counter() - t0,
        "policy": str(policy_folder),
    }
    save_reward_model(model, tokenizer, folder, meta)
    return meta


def ensure_reward_model(cfg: Any) -> bool:
    """Make ``text.reward_model.folder`` when it is missing (the pipeline's second step, after the base model),
    in a child process like :func:`srl.text.pretrain.ensure_base`; True when it was made now."""
    spec = cfg.text.reward_model
    if spec.folder is None or Path(spec.folder).exists():
        return False
    from srl.api.plugins import resolve

    if spec.oracle is None:
        raise ConfigError(f"text.reward_model.folder: {spec.folder!r} does not exist (and no oracle labels pairs)")
    resolve(spec.oracle, {}, "text.reward_model.oracle")
    prompts = cfg.env.kwargs.get("prompts")
    if not isinstance(prompts, str) or ":" not in prompts or prompts.endswith(".jsonl"):
        raise ConfigError("text.reward_model: pairs are drawn from a prompt generator (env.kwargs.prompts: module:fn)")
    resolve(prompts, {}, "env.kwargs.prompts")
    job = {
        "policy": str(cfg.text.model),
        "prompts": prompts,
        "prompt_args": dict(cfg.env.kwargs.get("prompt_args") or {}),
        "oracle": spec.oracle,
        "folder": str(spec.folder),
        "pairs": spec.pairs,
        "steps": spec.steps,
        "batch_size": spec.batch_size,
        "lr": spec.lr,
        "max_new_tokens": int(cfg.env.kwargs.get("max_new_tokens", 32)),
        "seed": spec.seed,
    }
    log.info("reward model %s is missing: training it on %d pairs labelled by %s", spec.folder, spec.pairs, spec.oracle)
    from srl.text.pretrain import run_in_child

    run_in_child("srl.text.reward_model", job, spec.folder, "text.reward_model: training")
    return True


def main(argv: list[str]) -> int:
    """``python -m srl.text.reward_model JOB_JSON``: one reward-model job (see :func:`ensure_reward_model`)."""
    import functools

    from srl.api.plugins import resolve

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    job = json.loads(argv[0])
    prompt_fn = functools.partial(resolve(job["prompts"], {}, "env.kwargs.prompts"), **job["prompt_args"])
    meta = train_reward_model(
        job["policy"],
        prompt_fn,
        resolve(job["oracle"], {}, "text.reward_model.oracle"),
        job["folder"],
        pairs=job["pairs"],
        steps=job["steps"],
        batch_size=job["batch_size"],
        lr=job["lr"],
        max_new_tokens=job["max_new_tokens"],
        seed=job["seed"],
    )
    log.info("reward model %s: held-out pair accuracy %s", job["folder"], meta["held_out_accuracy"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
