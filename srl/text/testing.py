"""Small text tasks for tests and smoke runs: a digits corpus, prompts of digits and a reward for sevens.

A model pre-trained for a few steps on :func:`digits` writes digit strings; :func:`sevens` then pays for the
share of sevens in a completion, which RL raises from about a tenth to most of it in a few updates.
"""

from __future__ import annotations

import numpy as np


def digits(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` random strings of 1 to 6 decimal digits."""
    return ["".join(map(str, rng.integers(0, 10, int(rng.integers(1, 7))))) for _ in range(n)]


def digit_prompts(rng: np.random.Generator, split: str) -> str:
    """A prompt of 1 to 3 digits (the split is not used: every prompt is as good as another)."""
    return "".join(map(str, rng.integers(0, 10, int(rng.integers(1, 4)))))


def sevens(prompts: list[str], completions: list[str]) -> list[float]:
    """The share of the characters of each completion that are ``7`` (0 for an empty completion)."""
    return [c.count("7") / len(c) if c else 0.0 for c in completions]


def lengths(prompts: list[str], completions: list[str]) -> list[float]:
    """Each completion's length in characters (tests check which reward a run used)."""
    return [float(len(c)) for c in completions]
