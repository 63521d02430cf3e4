"""The language model's passes on one GRPO-shaped batch: a no-grad log-prob pass, a training forward and
backward, and generation, in milliseconds (medians of ``--repeats``), one JSON line.

The batch is ``--batch`` rows of ``--group`` rows per prompt (the arithmetic task's prompts), ``--new``
completion tokens each; a training minibatch is half the rows, drawn at random as the trainer draws them.

    python scripts/bench_text_passes.py --model models/arith_sft --batch 128 --group 8 --new 4 --repeats 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from bench_generate import arithmetic_batch  # this folder's (scripts/ is on the path of a script run from it)

from srl.text.generate import completion_logits, completion_logp, generate, token_logp
from srl.text.hf import load_lm, load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/arith_sft")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new", type=int, default=4)
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok, model = load_tokenizer(args.model), load_lm(args.model)
    model.eval()
    rng = np.random.default_rng(0)
    ids, mask = arithmetic_batch(tok, args.batch, args.group, args.digits)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    with torch.no_grad():
        out = generate(model, ids, mask, args.new, eos_id=eos, pad_id=pad)
    tokens = out.tokens
    valid = (torch.arange(tokens.shape[1])[None] < out.lengths[:, None]).float()
    half = torch.from_numpy(rng.permutation(args.batch)[: args.batch // 2])

    def no_grad_logp() -> None:
        with torch.no_grad():
            completion_logp(model, ids, mask, tokens, valid)

    def train_pass() -> None:
        logits = completion_logits(model, ids[half], mask[half], tokens[half], valid[half])
        logits = logits[0] if isinstance(logits, tuple) else logits  # older code returned (logits, states)
        logp, _ = token_logp(logits, tokens[half])
        model.zero_grad()
        (logp * valid[half]).sum().backward()

    def sample() -> None:
        with torch.no_grad():
            generate(model, ids, mask, args.new, eos_id=eos, pad_id=pad)

    def ms(fn: Callable[[], None]) -> float:
        fn()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return round(1000 * statistics.median(times), 1)

    print(json.dumps({"batch": args.batch, "group": args.group, "new": args.new, "threads": args.threads,
                      "no_grad_logp_ms": ms(no_grad_logp), "train_half_ms": ms(train_pass),
                      "generate_ms": ms(sample)}))  # fmt: skip


if __name__ == "__main__":
    main()
