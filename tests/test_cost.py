"""The cost of a result: the energy counters on fake trees, the model's and the prices' sums by hand, the ledger's
sums over workers, restarts and earlier processes, a real run's core-seconds against the kernel's, and bad input."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import pytest

from srl.api.config import ConfigError, CostConfig, load_config
from srl.base.energy import EnergyUnavailable, Nvml, Rapl
from srl.system.cost import CostLedger, cost_text


def _domain(root: Path, name: str, label: str, energy: int, top: int = 1_000) -> Path:
    d = root / name
    d.mkdir()
    (d / "name").write_text(f"{label}\n")
    (d / "energy_uj").write_text(f"{energy}\n")
    (d / "max_energy_range_uj").write_text(f"{top}\n")
    return d


def test_rapl_sums_the_packages_across_a_wrap_and_leaves_out_their_parts_and_the_platform(tmp_path):
    first = _domain(tmp_path, "intel-rapl:0", "package-0", 900)
    core = _domain(tmp_path, "intel-rapl:0:0", "core", 500)  # a part of package 0: counted in it
    second = _domain(tmp_path, "intel-rapl:1", "package-1", 50)
    platform = _domain(tmp_path, "intel-rapl:2", "psys", 10)  # the whole platform: the packages again, and more
    rapl = Rapl(tmp_path)
    assert [d.name for d in rapl.domains] == ["intel-rapl:0", "intel-rapl:1"]
    (first / "energy_uj").write_text("100\n")  # wrapped at 1000: 900 -> 1000 -> 100 is 200 uJ
    (second / "energy_uj").write_text("550\n")  # 500 uJ
    for d in (core, platform):
        (d / "energy_uj").write_text("999\n")
    assert rapl.poll() == pytest.approx(700e-6)
    (first / "energy_uj").write_text("400\n")
    assert rapl.poll() == pytest.approx(1000e-6)  # 300 more, package 1 unchanged
    assert rapl.poll() == pytest.approx(1000e-6)


def test_rapl_missing_or_unreadable_is_one_line(tmp_path):
    with pytest.raises(EnergyUnavailable, match="no RAPL package counters under"):
        Rapl(tmp_path)
    with pytest.raises(EnergyUnavailable, match="no RAPL package counters under"):
        Rapl(tmp_path / "absent")
    d = _domain(tmp_path, "intel-rapl:0", "package-0", 5)
    (d / "energy_uj").unlink()
    (d / "energy_uj").mkdir()  # unreadable as a number
    with pytest.raises(EnergyUnavailable, match=r"intel-rapl:0/energy_uj: "):
        Rapl(tmp_path)


class _FakeNvml:
    """NVML's calls as ``pynvml`` names them, over two GPUs whose counters (millijoules) a test moves."""

    class NVMLError(Exception):
        pass

    def __init__(self, counters: list[int], fail: str | None = None) -> None:
        self.counters, self.fail = counters, fail

    def nvmlInit(self) -> None:  # noqa: N802 (NVML's own names)
        if self.fail:
            raise self.NVMLError(self.fail)

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.counters)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:  # noqa: N802
        return self.counters[handle]


def test_nvml_sums_every_gpus_counter_from_the_start_and_a_machine_without_one_is_one_line():
    lib = _FakeNvml([10_000_000, 20_000_000])  # millijoules since the driver loaded
    nvml = Nvml(lib)
    lib.counters = [10_250_000, 20_500_000]
    assert nvml.poll() == pytest.approx(750.0)
    with pytest.raises(EnergyUnavailable, match="NVML sees no GPU"):
        Nvml(_FakeNvml([]))
    with pytest.raises(EnergyUnavailable, match="NVML cannot read the GPUs' energy: Driver Not Loaded"):
        Nvml(_FakeNvml([1], fail="Driver Not Loaded"))


def test_the_model_and_the_prices_sum_as_by_hand():
    cost = CostConfig(watts_per_core=8.0, watts_per_gpu=250.0, price_per_core_hour=0.04, price_per_kwh=0.3)
    assert cost.estimate_joules(3600.0, 360.0) == (28_800.0, 90_000.0)
    # 1 core-hour at 0.04, no GPU price, 118,800 J = 0.033 kWh at 0.3
    assert cost.money(3600.0, 360.0, 118_800.0) == pytest.approx(0.04 + 0.033 * 0.3)
    assert CostConfig().money(3600.0, 360.0, 1e6) is None  # no price: no money figure
    assert CostConfig(price_per_gpu_hour=2.0).money(0.0, 1800.0, 0.0) == pytest.approx(1.0)


def test_the_ledger_sums_each_workers_starts_by_role_with_what_earlier_processes_spent():
    cfg = load_config("configs/cartpole_ppo.yaml", ["cost.cpu_energy=estimate", "cost.price_per_core_hour=3.6"])
    ledger = CostLedger(cfg, earlier={"core_seconds/actor": 5.0, "cpu_joules": 50.0, "gpu_seconds": 1.0})
    roles = {"actor0": "actor", "actor1": "actor", "trainer0": "trainer", "eval0": "eval"}
    meta: dict[str, Any] = {"worker": "actor0", "env_steps": 64, "cpu_seconds": 2.0}
    assert ledger.take("actor0", meta) == {"worker": "actor0", "env_steps": 64}  # the aggregators see no entry
    ledger.take("actor1", {"cpu_seconds": 3.0})
    ledger.take("actor0", {"cpu_seconds": 2.5})  # the newest of a start stands
    ledger.restarted("actor0")  # its 2.5 kept; the new start counts from 0
    ledger.take("actor0", {"cpu_seconds": 1.0})
    ledger.take("trainer0", {"cpu_seconds": 4.0, "gpu_seconds": 7.0})
    ledger.charge("eval0", 0.25)
    ledger.charge("eval0", 0.25)  # an in-process worker's polls
    before = time.process_time()
    figures = ledger.figures(roles)
    driver = figures["core_seconds"]["driver"]
    assert before - 0.5 <= driver <= time.process_time() - 0.5  # this process's CPU, less its workers' polls
    cores = figures["core_seconds"]
    assert cores["actor"] == pytest.approx(5.0 + 2.5 + 3.0 + 1.0) and cores["trainer"] == 4.0
    assert cores["eval"] == 0.5 and cores["total"] == pytest.approx(11.5 + 4.0 + 0.5 + driver)
    assert figures["gpu_seconds"] == pytest.approx(8.0)  # earlier 1 and the trainer's 7
    assert figures["energy_method"] == {"cpu": "estimate", "gpu": "estimate"}
    # this process's core-seconds at 10 W, the earlier processes' 50 J; the GPU's 7 s of this process at 300 W
    assert figures["cpu_joules"] == pytest.approx(50.0 + 10.0 * (cores["total"] - 5.0))
    assert figures["gpu_joules"] == pytest.approx(300.0 * 7.0)
    assert figures["money"] == pytest.approx(cores["total"] * 3.6 / 3600)
    spent = ledger.spent(roles)
    assert spent["core_seconds/actor"] == pytest.approx(11.5) and spent["gpu_seconds"] == pytest.approx(8.0)
    ledger.reached_target(roles, 12.0, 4096)
    ledger.take("trainer0", {"cpu_seconds": 40.0})
    ledger.reached_target(roles, 99.0, 9999)  # once: the first time stands
    summary = ledger.summary(roles)
    target = summary["to_target"]
    assert target["wall_seconds"] == 12.0 and target["env_steps"] == 4096
    assert target["core_seconds"] == pytest.approx(cores["total"], abs=0.05)
    assert summary["core_seconds"]["trainer"] == 40.0 > target["core_seconds"] - cores["total"] + 4.0
    line = cost_text(summary)
    assert line.startswith("cost: ") and "actor 11.5" in line and "(estimate)" in line and "to target" in line


@pytest.mark.slow
def test_a_local_runs_core_seconds_are_its_processes_cpu_time_by_the_kernels_count(tmp_path):
    """Each worker process's reports carry its CPU time, the last as it ends; summed over roles they are what the
    kernel counted for the run's child processes once they were reaped, and the figures to the target are the
    run's up to it."""
    from srl.runtime.train import train

    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        ["run.target_return=150", "run.total_env_steps=60000", "run.eval_episodes=0", "cost.cpu_energy=estimate"],
    )
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = train(cfg, tmp_path / "run", progress=None)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    kernel = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    cost = summary["cost"]
    workers = sum(v for k, v in cost["core_seconds"].items() if k not in ("driver", "total"))
    assert set(cost["core_seconds"]) == {"actor", "trainer", "driver", "total"}
    assert kernel > 0.5 and 0.93 * kernel <= workers <= kernel * 1.02  # each process reports its CPU as it ends
    assert summary["solved"] and cost["to_target"]["env_steps"] == summary["solved_env_steps"]
    assert 0 < cost["to_target"]["core_seconds"] <= cost["core_seconds"]["total"]
    assert cost["energy_joules"] == pytest.approx(10.0 * cost["core_seconds"]["total"])
    import json

    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0 < last["cost/core_seconds/trainer"] <= cost["core_seconds"]["trainer"]


def test_bad_prices_and_watts_and_a_counter_this_machine_lacks_are_one_line(tmp_path, monkeypatch, capsys):
    from srl.cli.main import main

    with pytest.raises(ConfigError, match=r"cost.watts_per_core: must be >= 0, got -1.0"):
        load_config("configs/cartpole_ppo.yaml", ["cost.watts_per_core=-1"])
    with pytest.raises(ConfigError, match=r"cost.price_per_kwh: must be >= 0 or null, got -0.2"):
        load_config("configs/cartpole_ppo.yaml", ["cost.price_per_kwh=-0.2"])
    monkeypatch.setattr("srl.base.energy.POWERCAP", tmp_path / "powercap")  # a machine without RAPL
    run = tmp_path / "run"
    code = main(["train", "configs/cartpole_ppo.yaml", "--set", "cost.cpu_energy=rapl", "--run-dir", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not run.exists()
    assert (
        err[0].startswith("srl: error: cost.cpu_energy: rapl: no RAPL package counters under") and "estimate" in err[0]
    )
    code = main(["train", "configs/cartpole_ppo.yaml", "--set", "cost.gpu_energy=nvml", "--run-dir", str(run)])
    err = capsys.readouterr().err.strip().splitlines()  # no GPU here: no package, or no driver, or no GPU
    assert code == 2 and len(err) == 1 and not run.exists() and err[0].startswith("srl: error: cost.gpu_energy: nvml: ")
