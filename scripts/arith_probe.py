"""Probes of the arithmetic task outside srl's system: plain synchronous GRPO, and continued fine-tuning.

Both start from a model folder (``models/arith_sft``) and print the greedy exact match on 1,000 held-out
prompts (and 1,000 training prompts) before and after, as ``srl eval`` scores it:

- ``grpo``: REINFORCE with each group's mean and standard deviation as baseline and scale (GRPO with one
  epoch of one minibatch, so every ratio is 1), on-policy, one Adam step per batch of ``--prompts`` x 8
  completions, no KL; written here in a few lines of torch, apart from srl's trainer, as a yardstick for how
  fast the reward can rise on this task at a given learning rate;
- ``sft``: more supervised fine-tuning on solved problems (the corpus of ``text.base``), at a constant rate.

    python scripts/arith_probe.py grpo --model models/arith_sft --lr 2e-4 --updates 400 --prompts 16
    python scripts/arith_probe.py sft --model models/arith_sft --lr 1e-3 --updates 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from srl.text import arithmetic
from srl.text.generate import generate
from srl.text.hf import load_lm, load_tokenizer
from srl.text.pretrain import lm_batch

GROUP = 8


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["grpo", "sft"])
    p.add_argument("--model", default="models/arith_sft")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=int, default=0, help="updates of linear warm-up")
    p.add_argument("--updates", type=int, default=400)
    p.add_argument("--prompts", type=int, default=16, help="grpo: prompts per batch (8 completions each)")
    p.add_argument("--batch", type=int, default=64, help="sft: solved problems per step")
    p.add_argument("--digits", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model, tok = load_lm(args.model), load_tokenizer(args.model)
    model.eval()  # no dropout in these models; eval mode keeps generation and training the same network
    pad, eos = int(tok.pad_token_id), int(tok.eos_token_id)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-5)

    def encode(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
        return enc["input_ids"], enc["attention_mask"]

    def sample(prompts: list[str], greedy: bool) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        ids, mask = encode(prompts)
        out = generate(model, ids, mask, args.digits + 2, eos_id=eos, pad_id=pad, greedy=greedy)
        rows = [[t for t in r[:n] if t not in (pad, eos)] for r, n in zip(out.tokens.tolist(), out.lengths.tolist())]
        return tok.batch_decode(rows), out.tokens, out.lengths

    def accuracy(split: str) -> float:
        r = np.random.default_rng(123)
        prompts = [arithmetic.prompts(r, split, args.digits) for _ in range(1000)]
        return float(np.mean(arithmetic.exact_match(prompts, sample(prompts, greedy=True)[0])))

    print(f"before: greedy held-out {accuracy('eval'):.3f}, train {accuracy('train'):.3f}", flush=True)
    t0, recent = time.perf_counter(), []
    for u in range(args.updates):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (u + 1) / max(args.warmup, 1))
        if args.mode == "sft":
            ids, labels = lm_batch(tok, arithmetic.corpus(rng, args.batch, args.digits))
            loss = model(input_ids=ids, attention_mask=(ids != pad).long(), labels=labels).loss
            recent.append(float(loss.detach()))
        else:
            prompts = [q for q in (arithmetic.prompts(rng, "train", args.digits) for _ in range(args.prompts))
                       for _ in range(GROUP)]  # fmt: skip
            texts, tokens, lengths = sample(prompts, greedy=False)
            reward = torch.tensor(arithmetic.exact_match(prompts, texts)).view(-1, GROUP)
            adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).view(-1)
            valid = (torch.arange(tokens.shape[1])[None] < lengths[:, None]).float()
            ids, mask = encode(prompts)
            full, attn = torch.cat([ids, tokens], 1), torch.cat([mask, valid.long()], 1)
            pos = (attn.cumsum(1) - 1).clamp(min=0)
            logits = model(input_ids=full, attention_mask=attn, position_ids=pos).logits[:, ids.shape[1] - 1 : -1]
            logp = torch.log_softmax(logits.float(), -1).gather(2, tokens[..., None]).squeeze(2)
            loss = -(adv[:, None] * logp * valid).sum() / valid.sum()
            recent.append(float(reward.mean()))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (u + 1) % 50 == 0:
            what = "loss" if args.mode == "sft" else "sampled reward"
            print(f"update {u + 1}: {what} {np.mean(recent[-50:]):.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"after: greedy held-out {accuracy('eval'):.3f}, train {accuracy('train'):.3f}", flush=True)


if __name__ == "__main__":
    main()
