"""The ``replay`` section: the replay store an off-policy algorithm learns from (``srl/replay/store.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    """Items of the declared sample schema kept in shared memory, sampled uniformly, by priority or in order,
    with samples per insert held at a setting so the update-to-data ratio does not follow the machine."""

    max_size: int = 100_000
    """Items kept; when full, the oldest segment columns are removed first (FIFO)."""
    min_size: int = 1_000
    """Items inserted before the first sample; they earn no samples (the rate limiter starts counting after)."""
    sampler: Literal["uniform", "prioritized", "fifo"] = "uniform"
    """``uniform`` draws live items with replacement; ``prioritized`` in proportion to priority^alpha, with
    importance weights; ``fifo`` hands each item out once, in insertion order (a queue)."""
    alpha: float = 0.6
    """Prioritized: exponent on priorities (0 samples uniformly, 1 fully in proportion)."""
    beta: float = 0.4
    """Prioritized: exponent of the importance weights at the run's start (0 leaves the sampling bias
    uncorrected, 1 corrects it)."""
    beta_final: float = 1.0
    """Prioritized: the exponent at the run's end; it moves linearly from ``beta`` with the env steps taken."""
    priority_eps: float = 1e-6
    """Prioritized: the floor of every priority, so no item starves (a zero TD error is floored to it)."""
    samples_per_insert: float = 8.0
    """Items sampled per item inserted, held by the rate limiter (Reverb's ``SampleToInsertRatio``): a learner
    that runs ahead waits for data, actors that run ahead wait for the learner. A queue (``fifo``) hands out each
    item once: 1."""
    error_buffer: float | None = None
    """How far (in samples) either side may run ahead of ``samples_per_insert``. None: the least that never holds
    both sides at once for the run's insert and sample batches (see ``srl/base/rate_limiter.py``)."""
    item_length: int = 1
    """Steps per item (1: a transition); at most ``workers.segment_length``. A recurrent policy's items are
    sequences, each with the state its first step was acted on with (R2D2)."""
    item_stride: int = 1
    """Steps between the starts of consecutive items of a stored segment column: 1 makes every window of
    ``item_length`` steps an item; R2D2's sequences of 80 steps overlapping by 40 are ``item_length: 80,
    item_stride: 40``. Nothing is stored twice either way: items are windows of the stored steps."""
    frame_stacks: tuple[str, ...] = ()
    """Observation parts whose leading axis is a stack of frames that moves on by one frame each step (Atari's
    ``[4, 84, 84]``): stored once per frame and restacked when sampled, about a quarter of the memory. An episode's
    first stack repeats its first frame (Gymnasium's ``FrameStackObservation`` and EnvPool both do); a part that
    does not restack exactly is refused at its first insert."""
    placement: Literal["trainer", "node"] = "trainer"
    """``trainer``: one replay per trainer, beside it (each data-parallel trainer samples the items of its own
    actors). ``node``: one per trainer node group (one in a run on one machine), shared by that group's trainers:
    each samples every item the group's actors sent, and the rate limiter holds their samples together."""
    save: bool = False
    """Write the replay beside each checkpoint, so a resumed run reloads it instead of refilling it."""

    def __post_init__(self) -> None:
        check(self.max_size >= 1, "max_size", f"must be >= 1, got {self.max_size}")
        check(self.min_size >= 1, "min_size", f"must be >= 1, got {self.min_size}")
        check(
            self.min_size <= self.max_size,
            "min_size",
            f"{self.min_size} items before the first sample never fit in max_size {self.max_size}",
        )
        for name in ("alpha", "beta", "beta_final"):
            value = getattr(self, name)
            check(0.0 <= value <= 1.0, name, f"must be in [0, 1], got {value}")
        check(
            math.isfinite(self.priority_eps) and self.priority_eps > 0,
            "priority_eps",
            f"must be > 0, got {self.priority_eps}",
        )
        spi = self.samples_per_insert
        check(math.isfinite(spi) and spi > 0, "samples_per_insert", f"must be > 0, got {spi}")
        check(
            self.sampler != "fifo" or spi == 1,
            "samples_per_insert",
            f"a fifo queue hands out each item once: must be 1, got {spi}",
        )
        buf = self.error_buffer
        check(buf is None or (math.isfinite(buf) and buf >= 0), "error_buffer", f"must be >= 0, got {buf}")
        check(self.item_length >= 1, "item_length", f"must be >= 1, got {self.item_length}")
        check(
            1 <= self.item_stride <= self.item_length,
            "item_stride",
            f"must be in [1, item_length={self.item_length}] (a larger stride never samples some steps), "
            f"got {self.item_stride}",
        )
        check(
            len(set(self.frame_stacks)) == len(self.frame_stacks),
            "frame_stacks",
            f"names a part twice: {list(self.frame_stacks)}",
        )
