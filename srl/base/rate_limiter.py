"""Holds whichever side of a replay runs ahead, so samples per insert stays at its setting.

Why: a replay's learner and its actors run at speeds set by the machine (how many
actors, how many cores, a GPU or not). Left alone, the number of times each item is
learned from (the update-to-data ratio) follows those speeds, and so do a run's
results. Reverb's ``SampleToInsertRatio`` fixes the ratio instead; this is the same
contract, written for batches and for counters that live in a two-element int64
array (private or shared memory), with one writer per counter.

Definitions (``I`` items inserted, ``S`` items sampled, a batch of ``B`` counts ``B``)::

    deficit  d = spi * (I - min_size) - S
    sample n     allowed iff  I >= min_size  and  d - n >= -error_buffer
    insert n     allowed iff  d + n * spi <= error_buffer

The first ``min_size`` inserts earn no samples (as in Reverb), so the sampler does not
start with a burst of ``spi * min_size`` samples of the first items. Filling up to
``min_size`` is never held: with ``S = 0`` and ``I + n <= min_size``, ``d + n*spi <= 0``.
Once ``I >= min_size``, ``-error_buffer <= d <= error_buffer`` for counters moved only by
these checks: an insert keeps ``d`` at most the buffer, a sample keeps it at least minus the
buffer, and each move pushes ``d`` only towards the bound it checks. So
``|S - spi * (I - min_size)| <= error_buffer`` throughout, and
:attr:`RateLimiter.measured_samples_per_insert`, defined as ``S / max(1, I - min_size)``,
is within ``error_buffer / (I - min_size)`` of ``spi``.

No deadlock. With ``A`` the largest insert batch and ``B`` the largest sample batch,
the constructor requires::

    (1)  2 * error_buffer >= spi * A + B
    (2)  error_buffer     >= spi * (A - 1)

Claim: for ANY counters ``I, S >= 0`` (reachable or restored under other settings) and
any batches ``1 <= n <= A``, ``1 <= m <= B``, inserting ``n`` or sampling ``m`` is allowed.
Proof. If ``I < min_size`` then ``I - min_size <= -1`` and ``S >= 0``, so
``d + n*spi <= (n - 1)*spi <= (A - 1)*spi <= error_buffer`` by (2): the insert is allowed.
If ``I >= min_size`` and the insert is held, then ``d > error_buffer - n*spi``, so
``d - m > error_buffer - A*spi - B >= -error_buffer`` by (1): the sample is allowed. QED.
Without (1), a ``d`` strictly between ``error_buffer - A*spi`` and ``B - error_buffer``
holds both full batches; without (2), so does ``I = min_size - 1, S = 0`` for an insert
of ``A``.

All comparisons are exact: ``spi`` and ``error_buffer`` are read as the exact rationals
their floats denote and every quantity is scaled to an integer, so rounding can never
open the gap that the proof closes.

Across processes: the inserting side alone writes ``I`` and the sampling side
alone writes ``S``. ``S`` only grows, which only loosens the insert check, and ``I`` only
grows, which only loosens the sample check, so a stale read of the other side's counter
can hold a move a little longer but never allow a wrong one.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["RateLimiter", "least_error_buffer"]

_INSERTS, _SAMPLES = 0, 1
_STATE_KEYS = ("inserts", "samples")


def _int_at_least(name: str, value: int, least: int) -> int:
    """``value`` as an int, or a one-line ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


def _finite(name: str, value: float, positive: bool) -> Fraction:
    """``value`` as the exact rational its float denotes, or a one-line ValueError."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return Fraction(float(value))


def _least_buffer(spi: Fraction, max_insert_batch: int, max_sample_batch: int) -> Fraction:
    """The smallest error buffer that meets both no-deadlock conditions (1) and (2) of the module docstring."""
    return max((spi * max_insert_batch + max_sample_batch) / 2, spi * (max_insert_batch - 1))


def least_error_buffer(samples_per_insert: float, max_insert_batch: int, max_sample_batch: int) -> float:
    """The smallest ``error_buffer`` the constructor accepts for these settings (rounded up to a float)."""
    spi = _finite("samples_per_insert", samples_per_insert, positive=True)
    exact = _least_buffer(spi, max_insert_batch, max_sample_batch)
    least = float(exact)
    return least if Fraction(least) >= exact else math.nextafter(least, math.inf)


class RateLimiter:
    """Samples-per-insert limiter with an error buffer; see the module docstring for the proof."""

    def __init__(
        self,
        samples_per_insert: float,
        min_size: int,
        error_buffer: float,
        max_insert_batch: int,
        max_sample_batch: int,
        counters: np.ndarray | None = None,
    ) -> None:
        """Validate the settings; ``counters`` is an int64 array of 2 to keep ``I, S`` in."""
        spi = _finite("samples_per_insert", samples_per_insert, positive=True)
        self.min_size = _int_at_least("min_size", min_size, 1)
        buf = _finite("error_buffer", error_buffer, positive=False)
        self.max_insert_batch = _int_at_least("max_insert_batch", max_insert_batch, 1)
        self.max_sample_batch = _int_at_least("max_sample_batch", max_sample_batch, 1)
        least = _least_buffer(spi, self.max_insert_batch, self.max_sample_batch)
        if buf < least:
            raise ValueError(
                f"error_buffer must be >= {float(least):g} for samples_per_insert {float(spi):g},"
                f" max_insert_batch {self.max_insert_batch} and max_sample_batch {self.max_sample_batch}"
                f" (below it both sides can be held at once), got {error_buffer!r}"
            )
        self.samples_per_insert = float(samples_per_insert)
        self.error_buffer = float(error_buffer)
        # Scale by the common denominator: every comparison below is on Python ints.
        unit = math.lcm(spi.denominator, buf.denominator)
        self._spi, self._buf, self._unit = int(spi * unit), int(buf * unit), unit
        self._counters = self._backing(counters)

    @staticmethod
    def _backing(counters: np.ndarray | None) -> np.ndarray:
        """A fresh zeroed counter pair, or the given one after checking its shape and dtype."""
        if counters is None:
            return np.zeros(2, dtype=np.int64)
        if counters.shape != (2,) or counters.dtype != np.int64:
            raise ValueError(f"counters must be an int64 array of shape (2,), got {counters.dtype} {counters.shape}")
        return counters

    @property
    def inserts(self) -> int:
        """Items inserted so far."""
        return int(self._counters[_INSERTS])

    @property
    def samples(self) -> int:
        """Items sampled so far."""
        return int(self._counters[_SAMPLES])

    def _scaled_deficit(self) -> int:
        """``d`` times the scale: samples earned beyond ``min_size`` minus samples taken."""
        return (self.inserts - self.min_size) * self._spi - self.samples * self._unit

    @property
    def deficit(self) -> float:
        """``spi * (I - min_size) - S``: samples owed to the sampler (negative: it is ahead)."""
        return self._scaled_deficit() / self._unit

    @property
    def measured_samples_per_insert(self) -> float:
        """``S / max(1, I - min_size)``: samples per insert since the replay reached ``min_size``."""
        return self.samples / max(1, self.inserts - self.min_size)

    def _batch(self, n: int, largest: int, side: str) -> int:
        """``n`` if it is a batch size the proof covers, else a ValueError (a caller bug)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= largest:
            raise ValueError(f"{side} batch must be an integer in [1, {largest}], got {n!r}")
        return int(n)

    def can_insert(self, n: int) -> bool:
        """Whether inserting ``n`` items now keeps the inserter at most the buffer ahead."""
        n = self._batch(n, self.max_insert_batch, "insert")
        return self._scaled_deficit() + n * self._spi <= self._buf

    def can_sample(self, n: int) -> bool:
        """Whether sampling ``n`` items now keeps the sampler at most the buffer ahead."""
        n = self._batch(n, self.max_sample_batch, "sample")
        inserts, samples = self._counters.tolist()  # one read (a replay worker samples a few thousand times a second)
        if inserts < self.min_size:
            return False
        return (inserts - self.min_size) * self._spi - (samples + n) * self._unit >= -self._buf

    def inserted(self, n: int) -> None:
        """Count an insert of ``n`` items; a RuntimeError if :meth:`can_insert` says no."""
        if not self.can_insert(n):
            raise RuntimeError(f"insert of {n} items is held by the rate limiter (deficit {self.deficit:g})")
        self._counters[_INSERTS] += n

    def sampled(self, n: int) -> None:
        """Count a sample of ``n`` items; a RuntimeError if :meth:`can_sample` says no."""
        if not self.can_sample(n):
            raise RuntimeError(f"sample of {n} items is held by the rate limiter (deficit {self.deficit:g})")
        self._counters[_SAMPLES] += n

    def state(self) -> dict[str, int]:
        """The counters, for a checkpoint; the settings come from the config."""
        return {"inserts": self.inserts, "samples": self.samples}

    def restore(self, state: dict[str, int]) -> None:
        """Load counters from :meth:`state`; any counters are safe under any settings (the proof)."""
        if sorted(state) != sorted(_STATE_KEYS):
            raise ValueError(f"rate limiter state must have keys {list(_STATE_KEYS)}, got {sorted(state)}")
        values = [_int_at_least(f"rate limiter state {key}", state[key], 0) for key in _STATE_KEYS]
        self._counters[:] = values
