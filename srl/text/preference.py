"""A preference task on English text: Python's own documentation as the corpus, a hidden oracle as the judge.

The corpus is the standard library's ``pydoc_data.topics`` (the help pages of the language reference, about
465k characters, on every Python installation). The base model learns to continue its text; a prompt is the
first words of one of its lines (a tenth of the help topics, by a fixed hash of their names, are held out for
evaluation). The oracle, which training never sees directly (it only labels the reward model's preference
pairs), counts the distinct real words of a completion: words of three or more letters that occur in the
corpus at least ``MIN_COUNT`` times. So it rewards fluent text, and a reward model trained on its labels can
be over-optimized: PPO against the model drifts to text that the model likes more than the oracle does.
"""

from __future__ import annotations

import functools
import re
import zlib

import numpy as np

MIN_COUNT = 5
"""A word is real when the corpus has it at least this often."""
_WORD = re.compile(r"[A-Za-z]{3,}")


@functools.cache
def _lines() -> dict[str, tuple[str, ...]]:
    """The corpus's non-empty prose lines, per split (held-out topics by a hash of their names)."""
    from pydoc_data.topics import topics

    out: dict[str, list[str]] = {"train": [], "eval": []}
    for name, text in topics.items():
        split = "eval" if zlib.crc32(name.encode()) % 10 == 0 else "train"
        for line in text.splitlines():
            line = line.strip()
            if len(line) >= 24 and line[0].isalpha() and not set(line) <= set("*=-~ "):
                out[split].append(line)
    return {k: tuple(v) for k, v in out.items()}


@functools.cache
def vocabulary() -> frozenset[str]:
    """The oracle's real words: lower-cased words of 3+ letters seen at least ``MIN_COUNT`` times."""
    from collections import Counter
    from pydoc_data.topics import topics

    counts = Counter(w.lower() for text in topics.values() for w in _WORD.findall(text))
    return frozenset(w for w, n in counts.items() if n >= MIN_COUNT)


def corpus(rng: np.random.Generator, n: int, chars: int = 96) -> list[str]:
    """``n`` windows of up to ``chars`` characters from the training topics' lines, for pre-training."""
    lines = _lines()["train"]
    out = []
    for i in rng.integers(0, len(lines), n):
        line = lines[int(i)]
        start = int(rng.integers(0, max(1, len(line) - chars // 2)))
        out.append(line[start : start + chars])
    return out


def prompts(rng: np.random.Generator, split: str, words: int = 3, max_chars: int = 40) -> str:
    """The first ``words`` words of a line of ``split``, at most ``max_chars`` characters, and a space (so the
    model goes on with a new word)."""
    lines = _lines()[split]
    return " ".join(lines[int(rng.integers(0, len(lines)))].split()[:words])[: max_chars - 1] + " "


def oracle(prompts: list[str], completions: list[str]) -> list[float]:
    """Distinct real words (see :func:`vocabulary`) in each completion."""
    vocab = vocabulary()
    return [float(len({w.lower() for w in _WORD.findall(c)} & vocab)) for c in completions]
