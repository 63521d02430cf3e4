"""Energy counters a machine keeps: the CPU packages' RAPL counters and the GPUs' NVML counters.

Why a few lines of our own and not a library: each of those reads these same two counters. codecarbon (3.3)
brings pandas, pydantic, requests, authlib and a dozen more for its carbon accounting; pyJoules has had no
release since 0.5.1; zeus is built around GPU power limits and its monitor's measurement windows. A run needs
each counter at its start, a poll now and then (a package's RAPL counter wraps at ``max_energy_range_uj``,
about 262 kJ on most parts: an hour or so at 60 W) and the sums, with one clear line where a counter cannot be
read. NVML itself is reached through ``nvidia-ml-py``, NVIDIA's own binding, imported only when asked.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")
"""Where Linux exposes RAPL (``intel-rapl:N`` per package, on AMD's EPYC and Ryzen too)."""


class EnergyUnavailable(RuntimeError):
    """A counter asked for cannot be read on this machine; the message says what is missing."""


class Rapl:
    """The energy of the machine's CPU packages since this object was made, from their RAPL counters
    (``energy_uj``, which wraps at ``max_energy_range_uj``): poll at least once per wrap period."""

    def __init__(self, root: Path | None = None) -> None:
        """``root``: :data:`POWERCAP` when None. Raises :class:`EnergyUnavailable` where no package counter is
        there or readable."""
        root = POWERCAP if root is None else root
        self.domains = sorted(
            d
            for d in (root.glob("intel-rapl:*") if root.is_dir() else ())
            if d.name.count(":") == 1 and _read_text(d / "name").startswith("package")
        )  # the packages: their sub-domains (core, uncore, dram) are parts of them
        if not self.domains:
            raise EnergyUnavailable(f"no RAPL package counters under {root} (no /sys/class/powercap/intel-rapl:N)")
        self.ranges = [_read_int(d / "max_energy_range_uj") for d in self.domains]
        self._last = [_read_int(d / "energy_uj") for d in self.domains]
        self.joules = 0.0

    def poll(self) -> float:
        """Joules since the start, the newest reading included."""
        for i, domain in enumerate(self.domains):
            now = _read_int(domain / "energy_uj")
            delta = now - self._last[i]
            if delta < 0:  # the counter wrapped (once: poll more often than it wraps)
                delta += self.ranges[i]
            self.joules += delta / 1e6
            self._last[i] = now
        return self.joules


class Nvml:
    """The energy of the machine's NVIDIA GPUs since this object was made, from their NVML counters (millijoules
    since the driver loaded; Volta and newer)."""

    def __init__(self, lib: Any = None) -> None:
        """``lib``: the ``pynvml`` module (``nvidia-ml-py``), imported when None. Raises
        :class:`EnergyUnavailable` without the package, a driver, a GPU, or a GPU with the counter."""
        if lib is None:
            try:
                lib = importlib.import_module("pynvml")
            except ImportError:
                raise EnergyUnavailable("NVML needs the nvidia-ml-py package (pip install nvidia-ml-py)") from None
        self.lib = lib
        try:
            lib.nvmlInit()
            self.handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
            self._start = [lib.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles]
        except lib.NVMLError as exc:
            raise EnergyUnavailable(f"NVML cannot read the GPUs' energy: {exc}") from None
        if not self.handles:
            raise EnergyUnavailable("NVML sees no GPU on this machine")
        self.joules = 0.0

    def poll(self) -> float:
        """Joules since the start (the counter is 64-bit: it does not wrap)."""
        now = [self.lib.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles]
        self.joules = sum(n - s for n, s in zip(now, self._start)) / 1e3
        return self.joules


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except PermissionError:
        raise EnergyUnavailable(
            f"{path}: not readable by this user (RAPL counters are root's since Linux 5.10)"
        ) from None
    except (OSError, ValueError) as exc:
        raise EnergyUnavailable(f"{path}: {exc}") from None
