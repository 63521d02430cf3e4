"""The ``cost`` section: how a run's energy is measured or modelled, and the prices that make its core-hours,
GPU-hours and energy into money (``summary.json``'s ``cost``, ``srl plan``'s energy and cost per hour)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class CostConfig:
    """What a result cost."""

    cpu_energy: Literal["auto", "rapl", "estimate"] = "auto"
    """``rapl``: the CPU packages' own energy counters (``/sys/class/powercap``, which must be readable here), the
    whole packages' energy while the run ran, other processes on them included; ``estimate``: ``watts_per_core``
    times the run's CPU core-seconds; ``auto``: ``rapl`` where it is readable, else ``estimate``."""
    gpu_energy: Literal["auto", "nvml", "estimate"] = "auto"
    """For a run with a CUDA device: ``nvml``, the GPUs' own energy counters (every GPU of the machine, through
    the ``nvidia-ml-py`` package); ``estimate``: ``watts_per_gpu`` times the seconds the run's processes held a
    GPU; ``auto``: ``nvml`` where it works, else ``estimate``."""
    watts_per_core: float = 10.0
    """The estimate's power of one busy core: a server core's share of its package's rated power is 4-12 W on
    current Xeon and EPYC parts."""
    watts_per_gpu: float = 300.0
    """The estimate's power of one GPU held by the run (an A100 PCIe is rated 250-300 W, an H100 SXM 700 W)."""
    price_per_core_hour: float | None = None
    """Money per CPU core-hour (a cloud's price of a vCPU-hour, say); ``None`` leaves it out of the cost."""
    price_per_gpu_hour: float | None = None
    """Money per GPU-hour; ``None`` leaves it out."""
    price_per_kwh: float | None = None
    """Money per kilowatt-hour of the run's energy; ``None`` leaves it out."""

    def __post_init__(self) -> None:
        for name in ("watts_per_core", "watts_per_gpu"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("price_per_core_hour", "price_per_gpu_hour", "price_per_kwh"):
            value = getattr(self, name)
            check(value is None or value >= 0, name, f"must be >= 0 or null, got {value}")

    @property
    def priced(self) -> bool:
        """Whether any price is set (a run's cost in money is reported only then)."""
        return any(p is not None for p in (self.price_per_core_hour, self.price_per_gpu_hour, self.price_per_kwh))

    def money(self, core_seconds: float, gpu_seconds: float, joules: float) -> float | None:
        """The price of ``core_seconds``, ``gpu_seconds`` and ``joules``: the sum of the terms whose price is
        set; ``None`` when none is."""
        if not self.priced:
            return None
        terms = (
            (self.price_per_core_hour, core_seconds / 3600.0),
            (self.price_per_gpu_hour, gpu_seconds / 3600.0),
            (self.price_per_kwh, joules / 3.6e6),
        )
        return sum(price * amount for price, amount in terms if price is not None)

    def estimate_joules(self, core_seconds: float, gpu_seconds: float) -> tuple[float, float]:
        """The model's energy of ``core_seconds`` and ``gpu_seconds``: (CPU joules, GPU joules)."""
        return self.watts_per_core * core_seconds, self.watts_per_gpu * gpu_seconds
