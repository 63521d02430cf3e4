"""Multi-digit addition as a text task with a verifiable reward (``configs/rlhf_arithmetic.yaml``).

A prompt is ``"482+39="``; the answer is the sum's digits. The pair ``(a, b)`` is held out when a fixed hash
of it falls in the eval tenth, so ``split="eval"`` prompts are never trained on. ``exact_match`` scores 1 for
the exact sum (surrounding spaces ignored) and 0 otherwise. ``corpus`` gives solved problems, what the base
model is fine-tuned on.

The answer may also be written units first (``corpus(..., reverse=True)`` and ``exact_match_reversed``:
``"482+39="`` is answered ``"125"`` for 521), the order in which the digits are computed: each digit then
depends on the operands' digits in that place and on the carry out of the digit written just before it, so a
small model can learn the rule rather than a table of sums (Lee et al. 2023, "Teaching Arithmetic to Small
Transformers", report the same for supervised training). ``configs/rlhf_arithmetic.yaml`` uses it.
"""

from __future__ import annotations

import re

import numpy as np

DIGITS = 3
"""Operands have 1 to ``DIGITS`` digits."""
_PROMPT = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*=\s*$")


def held_out(a: int, b: int) -> bool:
    """Whether the pair belongs to the evaluation split: one pair in ten, by the high bits of a multiplicative
    hash (low digits of a linear form would hold out every sum that ends in 0, never seen in training)."""
    h = ((a * 100_003 + b) * 2_654_435_761) & 0xFFFFFFFF
    return (h >> 22) % 10 == 0


def _operand(rng: np.random.Generator, digits: int) -> int:
    n = int(rng.integers(1, digits + 1))
    return int(rng.integers(0 if n == 1 else 10 ** (n - 1), 10**n))


def pair(rng: np.random.Generator, split: str = "train", digits: int = DIGITS) -> tuple[int, int]:
    """Two operands of the split, drawn with every operand length equally likely."""
    while True:
        a, b = _operand(rng, digits), _operand(rng, digits)
        if held_out(a, b) == (split == "eval"):
            return a, b


def prompts(rng: np.random.Generator, split: str, digits: int = DIGITS) -> str:
    """One prompt of ``split`` (the text task's ``env.kwargs.prompts``; ``env.kwargs.prompt_args.digits``)."""
    a, b = pair(rng, split, digits)
    return f"{a}+{b}="


def _answer(prompt: str, reverse: bool = False) -> str:
    """The sum an addition prompt asks for, its digits units first with ``reverse`` (a ValueError line for any
    other prompt)."""
    m = _PROMPT.match(prompt)
    if m is None:
        raise ValueError(f"not an addition prompt: {prompt!r}")
    digits = str(int(m.group(1)) + int(m.group(2)))
    return digits[::-1] if reverse else digits


def exact_match(prompts: list[str], completions: list[str]) -> list[float]:
    """1.0 where the completion is the sum (spaces around it ignored), else 0.0."""
    return [1.0 if completion.strip() == _answer(prompt) else 0.0 for prompt, completion in zip(prompts, completions)]


def exact_match_reversed(prompts: list[str], completions: list[str]) -> list[float]:
    """1.0 where the completion is the sum written units first (``corpus(..., reverse=True)``), else 0.0."""
    return [
        1.0 if completion.strip() == _answer(prompt, reverse=True) else 0.0
        for prompt, completion in zip(prompts, completions)
    ]


def digit_match(prompts: list[str], completions: list[str]) -> list[float]:
    """Partial credit for answers written most significant digit first: 1.0 for the exact sum, otherwise half
    the share of the sum's digits in place (counted from the units up, over the longer of the two), so an exact
    answer always scores above any near miss; an exact-match accuracy is then the share of scores equal to 1."""
    out = []
    for prompt, completion in zip(prompts, completions):
        want, got = _answer(prompt), completion.strip()
        if got == want:
            out.append(1.0)
        elif got.isdigit():
            same = sum(a == b for a, b in zip(reversed(want), reversed(got)))
            out.append(0.5 * same / max(len(want), len(got)))
        else:
            out.append(0.0)
    return out


def corpus(rng: np.random.Generator, n: int, digits: int = DIGITS, reverse: bool = False) -> list[tuple[str, str]]:
    """``n`` solved training problems as ``(prompt, answer)`` pairs, for supervised fine-tuning of the base model
    (``text.base.corpus``; ``text.base.corpus_args.digits``; ``reverse``: the sum's digits units first)."""
    out = []
    for _ in range(n):
        a, b = pair(rng, "train", digits)
        out.append((f"{a}+{b}=", str(a + b)[:: -1 if reverse else 1]))
    return out
