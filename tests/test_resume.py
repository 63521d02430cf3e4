"""``srl train --resume``: a run continues from its newest checkpoint with its counters and statistics intact."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from srl.api.config import ConfigError, load_config
from srl.runtime.train import resume_config, train
from srl.system.checkpoint import checkpoints, load_checkpoint

SHORT = ["run.target_return=null", "run.eval_episodes=0", "run.total_env_steps=6000"]


@pytest.mark.slow
@pytest.mark.parametrize("runtime,start", [("inline", "auto"), ("local", "exec")])
def test_resume_continues_counters_statistics_and_metrics(tmp_path, runtime, start) -> None:
    run = tmp_path / "run"
    cfg = load_config("configs/cartpole_ppo.yaml", [f"runtime={runtime}", f"workers.start_method={start}", *SHORT])
    first = train(cfg, run, progress=None)
    ckpt = load_checkpoint(checkpoints(run / "checkpoints")[-1])
    lines_before = (run / "metrics.jsonl").read_text().splitlines()

    cfg2, resume = resume_config(run, ["run.total_env_steps=12000"])
    assert resume.versions == (first["policy_version"],) == (int(ckpt["version"]),)
    assert resume.env_steps == first["env_steps"]  # the controller's count, beyond the checkpoint's trained samples
    second = train(cfg2, run, progress=None, resume=resume)
    assert second["resumed_from"] == str(resume.checkpoints[0])
    assert second["env_steps"] >= 12000 and second["policy_version"] > first["policy_version"]
    lines_after = (run / "metrics.jsonl").read_text().splitlines()
    assert lines_after[: len(lines_before)] == lines_before  # appended, not rewritten
    steps = [json.loads(line)["env_steps"] for line in lines_after]
    assert steps == sorted(steps) and steps[len(lines_before)] >= first["env_steps"]  # counts on, never back
    # per-version rates divide this process's bytes by this process's snapshots: one snapshot's size either way
    assert second["bytes_published_per_version"] == first["bytes_published_per_version"] > 0

    end = load_checkpoint(checkpoints(run / "checkpoints")[-1])
    updates = int(end["version"]) - int(ckpt["version"])
    assert end["algorithm"]["optimizer"]["steps"] == ckpt["algorithm"]["optimizer"]["steps"] + updates * 10 * 2
    count = "encoder.normalizers.obs.count"
    grown = float(end["algorithm"]["policy"][count] - ckpt["algorithm"]["policy"][count])
    assert grown == pytest.approx(updates * 512) and updates > 0  # statistics kept growing: 512 samples per update
    assert end["trained_samples"] == int(end["version"]) * 512
    assert torch.equal(
        load_checkpoint(resume.checkpoints[0])["algorithm"]["policy"][count], ckpt["algorithm"]["policy"][count]
    )


def test_resume_refuses_what_it_cannot_honour(tmp_path) -> None:
    run = tmp_path / "run"
    train(load_config("configs/cartpole_ppo.yaml", ["runtime=inline", *SHORT]), run, progress=None)
    with pytest.raises(ConfigError, match="model: cannot change when resuming"):
        resume_config(run, ["model.hidden=[32]"])
    with pytest.raises(ConfigError, match="not a run directory"):
        resume_config(tmp_path / "elsewhere", [])
    newest = checkpoints(run / "checkpoints")[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # truncated (as by a full disk outside our atomic write)
    with pytest.raises(ConfigError, match="a truncated file"):
        resume_config(run, [])
    for path in checkpoints(run / "checkpoints"):
        path.unlink()
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        resume_config(run, [])


def test_cli_resume_arguments_are_checked(tmp_path) -> None:
    def srl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "srl.cli.main", "train", *args], capture_output=True, text=True, timeout=60
        )

    both = srl("configs/cartpole_ppo.yaml", "--resume", str(tmp_path))
    assert both.returncode == 2 and "one of them" in both.stderr
    neither = srl()
    assert neither.returncode == 2 and "one of them" in neither.stderr
    moved = srl("--resume", str(tmp_path), "--run-dir", str(tmp_path / "x"))
    assert moved.returncode == 2 and "--run-dir" in moved.stderr


def test_a_full_disk_skips_periodic_checkpoints_and_fails_the_final_one_leaving_the_last_good(tmp_path, monkeypatch):
    import errno

    from srl.system.trainer_worker import TrainerWorker

    real = TrainerWorker._serialize
    calls = {"n": 0}

    def disk_fills_up(state, f):
        calls["n"] += 1
        if calls["n"] == 1:
            return real(state, f)
        f.write(b"\0" * 4096)  # part of the file reached the disk, then the disk was full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TrainerWorker, "_serialize", staticmethod(disk_fills_up))
    monkeypatch.setattr("srl.system.run_dir.FINAL_WAIT", 1.0)  # the final checkpoint waits 1 s for room, not 30
    run = tmp_path / "run"
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        ["runtime=inline", *SHORT, "run.total_env_steps=12000", "run.checkpoint_interval_seconds=0.01"],
    )
    summary = train(cfg, run, progress=None)
    assert summary["stop_reason"] == "error"
    assert "not written (No space left on device); the previous one is intact" in summary["error"]
    assert any("No space left on device" in w for w in summary["warnings"])  # periodic ones: warned, went on
    assert summary["policy_version"] > 2
    files = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != "controller.json")
    assert len(files) == 1 and files[0].startswith("ckpt_")  # the one good checkpoint, no temp files left
    assert load_checkpoint(run / "checkpoints" / files[0])["format"] == "srl-checkpoint-v2"


def test_a_record_a_full_disk_cuts_short_is_cut_back_whole(tmp_path):
    """``write_all``: the bytes a full disk took of a record are taken back, so the file ends at a whole record."""
    import errno

    from srl.base.fileio import write_all

    class FillsUp:  # an unbuffered file on a disk that fills up after 5 more bytes
        def __init__(self, f):
            self.f, self.room = f, None

        def write(self, data):
            if self.room is not None:
                if self.room == 0:
                    raise OSError(errno.ENOSPC, "No space left on device")
                data, self.room = data[: self.room], 0
            return self.f.write(data)

        def fileno(self):
            return self.f.fileno()

        def seek(self, offset):
            return self.f.seek(offset)

        def truncate(self, size):
            return self.f.truncate(size)

    with open(tmp_path / "log", "ab", buffering=0) as f:
        file = FillsUp(f)
        write_all(file, b'{"a": 1}\n')
        for room in (5, 3):  # cut short twice in a row: each time back to the end of the last whole record
            file.room = room
            with pytest.raises(OSError, match="No space left"):
                write_all(file, b'{"b": 2}\n')
        file.room = None  # room again
        write_all(file, b'{"c": 3}\n')
    assert (tmp_path / "log").read_bytes() == b'{"a": 1}\n{"c": 3}\n'


def test_a_runs_last_writes_wait_out_a_disk_full_for_a_moment():
    """``with_room``: a write that fails on a full disk (an OSError, or the run directory's RunDirFull) is tried
    again until it goes through or the wait is over; another error is not waited on."""
    import errno

    from srl.base.fileio import with_room
    from srl.system.run_dir import RunDirError, RunDirFull

    def full_twice(error):
        tries = []

        def write():
            tries.append(1)
            if len(tries) <= 2:
                raise error
            return len(tries)

        return write

    assert with_room(full_twice(OSError(errno.ENOSPC, "No space left on device")), 5.0) == 3
    assert (
        with_room(full_twice(RunDirFull("run directory R: No space left on device (summary.json not written)")), 5.0)
        == 3
    )
    with pytest.raises(OSError, match="No space"):
        with_room(full_twice(OSError(errno.ENOSPC, "No space left on device")), 0.0)
    with pytest.raises(RunDirError, match="deleted"):  # lost for good: not waited on
        with_room(full_twice(RunDirError("run directory R: deleted or moved (metrics not written)")), 5.0)


def test_a_disk_full_for_a_while_skips_the_records_and_the_run_goes_on(tmp_path, monkeypatch):
    """While the run directory's disk is full the controller's writes (metrics, counters) are skipped with one
    warning, and a second once they go through again; the run ends as it would have, its records whole."""
    import errno

    from srl.system import run_dir

    real, real_atomic, calls = run_dir.write_all, run_dir.atomic_write_text, {"n": 0, "full": False}

    def full_for_a_while(file, data):  # each record (after the third) and the counters written after it
        calls["n"] += 1
        calls["full"] = 3 <= calls["n"] <= 6
        if calls["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(file, data)

    def counters(path, text):
        if calls["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_atomic(path, text)

    monkeypatch.setattr(run_dir, "write_all", full_for_a_while)
    monkeypatch.setattr(run_dir, "atomic_write_text", counters)
    cfg = load_config("configs/cartpole_ppo.yaml", ["runtime=inline", *SHORT, "run.total_env_steps=12000"])
    summary = train(cfg, tmp_path / "run", progress=None)
    assert "error" not in summary and summary["stop_reason"] == "env_steps" and calls["n"] > 8
    full = [w for w in summary["warnings"] if "No space left on device (metrics not written)" in w]
    again = [w for w in summary["warnings"] if "written again, 8 write(s) skipped" in w]  # 4 records, 4 counters
    assert len(full) == 1 and len(again) == 1, summary["warnings"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == calls["n"] - 4 and json.loads((tmp_path / "run" / "summary.json").read_text())


@pytest.mark.slow
def test_kill_9_of_the_trainer_without_restarts_fails_the_run_and_resume_finishes_it(tmp_path) -> None:
    """With restarts off a dead trainer ends the run (with them on it restarts: see test_faults.py)."""
    import os
    import signal
    import time

    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "srl.cli.main",
        "train",
        "configs/cartpole_ppo.yaml",
        "--quiet",
        "--run-dir",
        str(run),
        "--set",
        "run.checkpoint_interval_seconds=0.2",
        "--set",
        "run.eval_episodes=3",
        "--set",
        "workers.max_restarts=0",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
            (run / "workers.json").exists()
            and any(load_checkpoint(p)["version"] >= 3 for p in checkpoints(run / "checkpoints"))
        ):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.kill(json.loads((run / "workers.json").read_text())["trainer0"], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1] == "srl: error: trainer0: exited with code -9"
    last = load_checkpoint(checkpoints(run / "checkpoints")[-1])  # the newest one is whole
    resumed = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "train", "--resume", str(run), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["solved"] and summary["policy_version"] > int(last["version"])
    assert summary["env_steps"] >= int(last["trained_samples"])


def test_weights_and_biases_mirrors_the_metrics_when_asked(tmp_path, monkeypatch) -> None:
    import types

    calls: list = []
    fake = types.ModuleType("wandb")

    class FakeRun:
        def log(self, data, step):
            calls.append(("log", step, data))

        def finish(self):
            calls.append(("finish",))

    fake.init = lambda **kw: calls.append(("init", kw)) or FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = tmp_path / "run"
    cfg = load_config("configs/cartpole_ppo.yaml", ["runtime=inline", *SHORT, "run.wandb_project=srl-tests"])
    train(cfg, run, progress=None)
    cfg2, resume = resume_config(run, ["run.total_env_steps=9000"])
    train(cfg2, run, progress=None, resume=resume)
    inits = [c[1] for c in calls if c[0] == "init"]
    assert len(inits) == 2 and inits[0]["project"] == "srl-tests" and inits[0]["id"] == inits[1]["id"]
    logged = [c for c in calls if c[0] == "log"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(logged) == len(records) and logged[-1][1] == records[-1]["env_steps"]
    assert calls.count(("finish",)) == 2


def test_weights_and_biases_missing_is_one_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    cfg = load_config("configs/cartpole_ppo.yaml", ["runtime=inline", *SHORT, "run.wandb_project=p"])
    with pytest.raises(ConfigError, match="run.wandb_project: Weights & Biases is not installed"):
        train(cfg, tmp_path / "run", progress=None)


def test_resume_keeps_the_actors_reward_scaling_statistics(tmp_path) -> None:
    import numpy as np

    run = tmp_path / "run"
    short = ["runtime=inline", "run.target_return=null", "run.eval_episodes=0", "run.total_env_steps=4096"]
    train(load_config("configs/pendulum_ppo.yaml", short), run, progress=None)
    saved = run / "checkpoints" / "rewards_actor0.npy"
    first = np.load(saved, allow_pickle=False)
    assert first.shape == (2, 3) and (first[:, 2] >= 2048).all()  # [mean, var, count] per slot
    cfg2, resume = resume_config(run, ["run.total_env_steps=8192"])
    train(cfg2, run, progress=None, resume=resume)
    second = np.load(saved, allow_pickle=False)
    assert (second[:, 2] >= first[:, 2] + 1024).all()  # counted on from the saved statistics, not from zero


@pytest.mark.slow
def test_resume_continues_wall_time_episodes_and_the_return_window(tmp_path) -> None:
    """Across a resume the records' wall time and episodes go on from where the run stopped (so a plot over wall
    time never draws backwards), and the first record after it has the return of the restored window."""
    run = tmp_path / "run"
    first = train(load_config("configs/cartpole_ppo.yaml", ["runtime=inline", *SHORT]), run, progress=None)
    before = len((run / "metrics.jsonl").read_text().splitlines())
    # a record after every round of polls: the first comes before any episode of the resumed run can end
    cfg2, resume = resume_config(run, ["run.total_env_steps=12000", "run.log_interval_seconds=0.000001"])
    second = train(cfg2, run, progress=None, resume=resume)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("wall_seconds", "episodes"):
        values = [r[key] for r in records]
        assert values == sorted(values), key  # non-decreasing, across the boundary too
        assert second[key] > first[key], key
    assert math.isfinite(records[before]["return_mean"])
    counters = json.loads((run / "checkpoints" / "controller.json").read_text())
    del counters["env_steps"]  # as a run saved them before they counted env steps: the checkpoints' count stands in
    (run / "checkpoints" / "controller.json").write_text(json.dumps(counters))
    assert resume_config(run, ["run.total_env_steps=12500"])[1].env_steps < second["env_steps"]
    (run / "checkpoints" / "controller.json").unlink()  # a run saved without the counters still resumes
    cfg3, resume = resume_config(run, ["run.total_env_steps=12500"])
    third = train(cfg3, run, progress=None, resume=resume)
    assert third["stop_reason"] == "env_steps" and third["episodes"] < second["episodes"]


def test_the_controller_counters_reach_the_next_process_per_policy_and_a_damaged_file_is_one_line(tmp_path) -> None:
    import time

    import numpy as np

    from srl.api.config import ExperimentConfig, build
    from srl.system.controller import Controller
    from conftest import reporting

    from srl.runtime.topology import ACTOR
    from srl.system.run_dir import Resume, RunDir, read_counters

    rules = [{"match": "red_.*", "policy": "red"}, {"match": "blue_.*", "policy": "blue"}]
    cfg = build(ExperimentConfig, {"agents": rules, "run": {"return_window": 3}})
    rd = RunDir(tmp_path / "run", cfg)
    before = reporting(Controller(cfg, rd, time.time() - 50.0, progress=None), ACTOR)  # ran 50 s
    owners = np.array([0, 1, 0, 1, 0])
    before.handle(
        "actor",
        {"worker": "actor0", "env_steps": 64, "cpu_seconds": 30.0},
        {"episode_returns": np.arange(1.0, 6.0), "episode_policies": owners},
    )
    before.tick(force=True)
    rd.close()
    resume = Resume(checkpoints=(), versions=(0, 0), env_steps=64, counters=read_counters(tmp_path / "run"))
    after = Controller(cfg, None, time.time(), progress=None, resume=resume)
    record = after.record()
    assert record["episodes"] == 5 and record["wall_seconds"] >= 50.0 and record["return_mean"] == 4.0
    first, second = cfg.policy_names
    assert record[f"{first}/return_mean"] == 3.0 and record[f"{second}/return_mean"] == 3.0  # [1, 3, 5] and [2, 4]
    assert (
        record["cost/core_seconds/actor0"] == 30.0
    )  # what the earlier process's workers spent counts on (no roles here)
    assert record["cost/core_seconds/driver"] > 0 and record["cost/energy_joules"] >= 10.0 * 30.0
    (tmp_path / "run" / "checkpoints" / "controller.json").write_text('{"wall_seconds": 1.0, "episodes": -1}')
    with pytest.raises(ConfigError, match=r"controller.json: not readable \(episodes: an integer >= 0 expected\)"):
        read_counters(tmp_path / "run")


def test_a_finished_run_resumed_says_there_is_nothing_to_do(tmp_path) -> None:
    """Its budget spent, or its return window at its target already: one line naming the setting, before anything
    starts; with the setting raised it trains on."""
    run = tmp_path / "run"
    done = train(load_config("configs/cartpole_ppo.yaml", ["runtime=inline", *SHORT]), run, progress=None)
    with pytest.raises(ConfigError, match=rf"run.total_env_steps: {run} has taken {done['env_steps']:,} of its 6,000"):
        resume_config(run, [])
    window = json.loads((run / "checkpoints" / "controller.json").read_text())["returns"]
    met = sum(window) / len(window) - 1.0
    with pytest.raises(ConfigError, match="run.target_return: the run's last 20 episodes already average"):
        resume_config(run, ["run.total_env_steps=12000", f"run.target_return={met}"])
    cfg, resume = resume_config(run, ["run.total_env_steps=12000", f"run.target_return={met + 100}"])
    assert resume.env_steps == done["env_steps"] and cfg.run.total_env_steps == 12000


def test_srl_train_help_lists_every_setting_fixed_on_resume() -> None:
    from srl.api.config import FIXED_ON_RESUME

    out = subprocess.run([sys.executable, "-m", "srl.cli.main", "train", "--help"], capture_output=True, text=True)
    text = " ".join(out.stdout.split())
    assert all(key in text for key in FIXED_ON_RESUME) and "replay.placement" in text
