"""Generation throughput on one batch: srl's KV-cache loop (``srl.text.generate``) against ``model.generate``.

Both sample the same batch (left-padded prompts of the arithmetic task, temperature 1, no top-p) from the same
model in this process, alternately, ``--repeats`` times each; one JSON line per method with the median
completion tokens per second (end-of-sequence tokens included, pads after it not). ``--group`` rows share each
prompt, as GRPO's groups do (srl's loop then runs each distinct prompt once; ``model.generate`` runs every row).

    python scripts/bench_generate.py --model models/arith_sft --batch 128 --group 8 --digits 2 --new 4 --repeats 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import torch

from srl.text import arithmetic
from srl.text.algorithm import prompt_mask
from srl.text.generate import generate
from srl.text.hf import load_lm, load_tokenizer


def arithmetic_batch(tok: Any, rows: int, group: int, digits: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` left-padded prompts of the arithmetic task's train split, ``group`` rows per prompt (as GRPO's
    groups), and their prompt mask (also what ``bench_text_passes.py`` times)."""
    rng = np.random.default_rng(seed)
    drawn = [arithmetic.prompts(rng, "train", digits) for _ in range(-(-rows // group))]
    prompts = [p for p in drawn for _ in range(group)][:rows]
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"], prompt_mask(enc["input_ids"], tok.pad_token_id)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/arith_sft")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--new", type=int, default=5, help="max new tokens")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--group", type=int, default=8, help="rows per prompt (1: every row its own prompt)")
    p.add_argument("--digits", type=int, default=2, help="operand digits of the arithmetic prompts")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok, model = load_tokenizer(args.model), load_lm(args.model)
    ids, mask = arithmetic_batch(tok, args.batch, args.group, args.digits)
    eos, pad = tok.eos_token_id, tok.pad_token_id

    def ours() -> int:
        out = generate(model, ids, mask, args.new, eos_id=eos, pad_id=pad)
        return int(out.lengths.sum())

    def theirs() -> int:
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=args.new,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        new = out[:, ids.shape[1] :]
        ended = (new == eos).int()
        # tokens up to and including the first end-of-sequence token (all of them where none ended)
        first = torch.where(ended.any(1), ended.argmax(1) + 1, torch.full_like(ended[:, 0], new.shape[1]))
        return int(first.sum())

    rates: dict[str, list[float]] = {"srl": [], "model.generate": []}
    with torch.inference_mode():
        ours(), theirs()  # warm-up
        for _ in range(args.repeats):
            for name, fn in (("srl", ours), ("model.generate", theirs)):
                t0 = time.perf_counter()
                n = fn()
                rates[name].append(n / (time.perf_counter() - t0))
    for name, r in rates.items():
        print(json.dumps({"method": name, "batch": args.batch, "group": args.group, "max_new_tokens": args.new,
                          "completion_tokens_per_second": statistics.median(r), "repeats": args.repeats}))  # fmt: skip


if __name__ == "__main__":
    main()
