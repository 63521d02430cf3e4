"""Tests for srl.base.tb_scalars: what we write reads back in TensorBoard's own reader, steps and values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from srl.api.config import load_config
from srl.base.tb_scalars import ScalarWriter
from srl.system.run_dir import RunDir


def _load(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def _steps_values(acc, tag: str) -> list[tuple[int, float]]:
    return [(s.step, s.value) for s in acc.Scalars(tag)]


def test_tensorboard_reads_back_tags_steps_values_and_wall_times(tmp_path: Path) -> None:
    with ScalarWriter(tmp_path) as w:
        w.add_scalar("train/loss", 1.0, step=0, wall_time=1000.0)
        w.add_scalars({"train/loss": 0.5, "eval/return": -3.25}, step=10, wall_time=1001.0)
        w.add_scalar("eval/return", 200.125, step=15, wall_time=1002.0)
        w.add_scalar("loss/é", np.float64(0.25), step=np.int64(2**40))
        w.add_scalars({}, step=99)  # writes nothing
    acc = _load(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == ["eval/return", "loss/é", "train/loss"]
    assert _steps_values(acc, "train/loss") == [(0, 1.0), (10, 0.5)]
    assert _steps_values(acc, "eval/return") == [(10, -3.25), (15, 200.125)]
    assert _steps_values(acc, "loss/é") == [(2**40, 0.25)]
    assert [s.wall_time for s in acc.Scalars("train/loss")] == [1000.0, 1001.0]


def test_values_are_float32_and_many_events_all_arrive(tmp_path: Path) -> None:
    n = 1000
    with ScalarWriter(tmp_path) as w:
        for i in range(n):
            w.add_scalar("x", i * 0.1, step=i)
            if i % 10 == 0:
                w.add_scalars({"y": -i, "z": i * i}, step=i)
    acc = _load(tmp_path)
    assert [s.step for s in acc.Scalars("x")] == list(range(n))
    assert [s.value for s in acc.Scalars("x")] == [float(np.float32(i * 0.1)) for i in range(n)]
    assert _steps_values(acc, "y") == [(i, float(-i)) for i in range(0, n, 10)]
    assert [s.value for s in acc.Scalars("z")] == [float(np.float32(i * i)) for i in range(0, n, 10)]


def test_event_file_opens_on_the_first_write_and_is_readable_when_it_returns(tmp_path: Path) -> None:
    log_dir = tmp_path / "nested" / "tb"
    w = ScalarWriter(log_dir)
    try:
        assert log_dir.is_dir() and not list(log_dir.iterdir())  # nothing opened before a scalar comes
        w.add_scalar("x", 1.5, step=3)
        (path,) = log_dir.iterdir()
        assert path.name.startswith("events.out.tfevents.")
        assert _steps_values(_load(log_dir), "x") == [(3, 1.5)]
    finally:
        w.close()


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    w = ScalarWriter(tmp_path)
    w.add_scalar("x", 1.0, step=1)
    w.close()
    w.close()
    assert w.closed
    with pytest.raises(ValueError, match="closed"):
        w.add_scalar("x", 2.0, step=2)
    assert _steps_values(_load(tmp_path), "x") == [(1, 1.0)]
    ScalarWriter(tmp_path / "unused").close()  # never written: no file, nothing to close


def test_run_dir_mirrors_numeric_metrics_at_env_steps(tmp_path: Path) -> None:
    cfg = load_config("configs/cartpole_ppo.yaml")
    rd = RunDir(tmp_path / "run", cfg)
    rd.log({"env_steps": 100, "return_mean": 9.5, "fps": 1000, "solved": False, "lag_mean": float("nan")}, 100)
    rd.log({"env_steps": 250, "return_mean": 21.0, "fps": 1200, "phase": "train"}, 250)
    rd.close()
    acc = _load(tmp_path / "run" / "tb")
    assert sorted(acc.Tags()["scalars"]) == ["fps", "return_mean"]  # no bools, strings, NaN, nor the step itself
    assert _steps_values(acc, "return_mean") == [(100, 9.5), (250, 21.0)]
    assert _steps_values(acc, "fps") == [(100, 1000.0), (250, 1200.0)]


def test_tensorboard_is_not_imported_before_the_first_scalar(tmp_path: Path) -> None:
    """The start path (CLI, train, run directory) must not pay for tensorboard before workers step."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import srl.cli.main, srl.runtime.train\n"
        "from srl.api.config import load_config\n"
        "from srl.system.run_dir import RunDir\n"
        f"rd = RunDir(Path({str(tmp_path / 'run')!r}), load_config('configs/cartpole_ppo.yaml'))\n"
        "assert 'tensorboard' not in sys.modules, 'imported at start'\n"
        "rd.log({'return_mean': 1.0}, 1)\n"
        "assert 'tensorboard' in sys.modules\n"
        "rd.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
