"""Making a base model here: a tokenizer trained on a corpus, a small causal LM trained on it by next-token
prediction, saved as a model folder (safetensors). This is the pipeline's first step (``text.base``): a run
whose ``text.model`` folder is missing makes it first, once, and later runs find it cached.

The corpus is ``module:function`` with ``function(rng: numpy.random.Generator, n: int)`` returning ``n``
documents, drawn fresh for every batch, so a generated corpus (arithmetic, a grammar) never repeats and a
fixed one is sampled with replacement. A document is a string (pre-training: the loss is on every token) or a
``(prompt, completion)`` pair (supervised fine-tuning: the loss is on the completion's tokens only). Each
document is followed by the end-of-sequence token, which the model learns to emit.
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srl.algorithms.adam import Adam
from srl.api.config import ConfigError, build, to_dict
from srl.api.config.text import LMSpec
from srl.text.hf import build_lm, save_lm, train_tokenizer

log = logging.getLogger(__name__)

Corpus = Callable[[np.random.Generator, int], list[Any]]


def resolve_corpus(spec: str, where: str) -> Corpus:
    from srl.api.plugins import resolve

    return resolve(spec, {}, where)


Document = str | tuple[str, str]


def lm_batch(tokenizer: Any, docs: list[Document]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``labels`` for ``docs``, each ended by the EOS token; labels are -100 on
    pads and on the prompt of a ``(prompt, completion)`` pair."""
    eos, pad = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
    pairs = [(d, "") if isinstance(d, str) else d for d in docs]
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    answers = tokenizer([c for _, c in pairs], add_special_tokens=False)["input_ids"]
    width = max(len(p) + len(c) + 1 for p, c in zip(prompts, answers))
    ids = torch.full((len(docs), width), pad, dtype=torch.long)
    labels = torch.full((len(docs), width), -100, dtype=torch.long)
    for i, ((_, completion), p, c) in enumerate(zip(pairs, prompts, answers)):
        row = p + c + [eos]
        ids[i, : len(row)] = torch.tensor(row)
        first = len(p) if completion else 0  # a plain document is learned whole (its first token has no target)
        labels[i, first : len(row)] = torch.tensor(row[first:])
    return ids, labels


def _text(doc: Document) -> str:
    return doc if isinstance(doc, str) else doc[0] + doc[1]


def pretrain(
    corpus: Corpus,
    spec: LMSpec,
    folder: str | Path,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    vocab_size: int,
    seed: int = 0,
    log_every: int = 100,
) -> dict[str, float]:
    """Train a tokenizer and a model of ``spec`` on ``corpus`` for ``steps`` steps and save both to ``folder``;
    return the final loss and the wall time."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    tokenizer = train_tokenizer([_text(d) for d in corpus(rng, 20_000)], vocab_size)
    model = build_lm(spec, tokenizer)
    model.train()
    opt = Adam(model.parameters(), lr=lr)
    warmup = max(1, steps // 20)
    loss_avg = float("nan")
    for step in range(steps):
        opt.lr = lr * min(1.0, (step + 1) / warmup) * (1.0 - step / steps)
        ids, labels = lm_batch(tokenizer, corpus(rng, batch_size))
        attention = (ids != int(tokenizer.pad_token_id)).long()
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        loss_avg = value if step == 0 else 0.98 * loss_avg + 0.02 * value
        if log_every and (step + 1) % log_every == 0:
            log.info("pretrain step %d/%d loss %.4f", step + 1, steps, loss_avg)
    model.eval()
    wall = time.perf_counter() - t0
    meta = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "loss": loss_avg, "seconds": wall}
    save_lm(model, tokenizer, folder, {"pretrain": meta, "parameters": int(model.num_parameters())})
    return meta


def ensure_base(cfg: Any) -> bool:
    """Make ``text.model`` from ``text.base`` when the folder is missing (the pipeline's first step); True when it
    was made now. A missing folder without ``text.base`` is one line naming it.

    The training runs in a child process of its own (``python -m srl.text.pretrain``), so the caller, which may
    go on to fork workers, never starts torch's thread pools."""
    text = cfg.text
    if text.model is None or Path(text.model).exists():
        return False
    base = text.base
    if base.corpus is None:
        raise ConfigError(f"text.model: model folder {text.model!r} does not exist (and no text.base makes it)")
    resolve_corpus(base.corpus, "text.base.corpus")  # a wrong name is one line here, not a child's traceback
    job = {
        "corpus": base.corpus,
        "corpus_args": dict(base.corpus_args),
        "model": to_dict(base.model),
        "folder": str(text.model),
        "steps": base.steps,
        "batch_size": base.batch_size,
        "lr": base.lr,
        "vocab_size": base.vocab_size,
        "seed": base.seed,
    }
    log.info("text.model %s is missing: pre-training it from %s (%d steps)", text.model, base.corpus, base.steps)
    run_in_child("srl.text.pretrain", job, text.model, "text.base: pre-training")
    return True


def run_in_child(module: str, job: Mapping[str, Any], folder: str, what: str) -> None:
    """Run ``python -m module JOB_JSON`` (its log goes to this process's output); one line naming ``what`` when
    it fails or leaves no ``folder``."""
    done = subprocess.run([sys.executable, "-m", module, json.dumps(dict(job))], check=False)
    if done.returncode != 0 or not Path(folder).is_dir():
        raise ConfigError(f"{what} {folder!r} failed (exit code {done.returncode})")


def main(argv: list[str]) -> int:
    """``python -m srl.text.pretrain JOB_JSON``: one pre-training job (see :func:`ensure_base`)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    job = json.loads(argv[0])
    corpus = resolve_corpus(job["corpus"], "text.base.corpus")
    meta = pretrain(
        functools.partial(corpus, **job["corpus_args"]),
        build(LMSpec, job["model"]),
        job["folder"],
        steps=job["steps"],
        batch_size=job["batch_size"],
        lr=job["lr"],
        vocab_size=job["vocab_size"],
        seed=job["seed"],
    )
    log.info("pre-trained %s: loss %.4f in %.0f s", job["folder"], meta["loss"], meta["seconds"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
