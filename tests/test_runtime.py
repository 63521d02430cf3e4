"""Runtimes end to end: determinism, the run directory contract, checkpoints, clean shutdown on signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import children_of, reporting, start_endless_training

from srl.api.config import ConfigError, load_config
from srl.api.worker import TrainResult
from srl.base.shm import list_segments
from srl.runtime.inline import run_inline
from srl.runtime.plan import make_plan
from srl.runtime.train import train
from srl.system.controller import Controller, stop_on_signals
from srl.system.checkpoint import ACTING_ENTRIES, CHECKPOINT_FORMAT, checkpoints, load_checkpoint

CARTPOLE = "configs/cartpole_ppo.yaml"
SMALL = ["run.total_env_steps=3000", "run.target_return=null", "run.eval_episodes=2"]


def test_inline_runtime_is_deterministic_given_the_seed():
    cfg = load_config(CARTPOLE, ["runtime=inline", "workers.autotune=true", *SMALL])
    snapshots = []
    for _ in range(2):
        plan = make_plan(cfg)
        controller = Controller(cfg, None, time.time(), progress=None)
        snapshots.append(run_inline(plan, controller, None))
        assert controller.policy_version >= 2
    assert np.array_equal(snapshots[0], snapshots[1])
    assert controller.record()["update_threads"] == cfg.workers.torch_threads  # no hand-over inline
    off = load_config(CARTPOLE, ["runtime=inline", "workers.autotune=false", *SMALL])  # the switch changes nothing
    assert np.array_equal(run_inline(make_plan(off), Controller(off, None, time.time(), progress=None), None),
                          snapshots[0])  # fmt: skip
    other = load_config(CARTPOLE, ["runtime=inline", "seed=7", *SMALL])
    controller = Controller(other, None, time.time(), progress=None)
    assert not np.array_equal(run_inline(make_plan(other), controller, None), snapshots[0])


def test_inline_trains_each_batch_on_the_policy_two_versions_back_as_a_trainer_bound_local_run_does():
    """With ring_size 2 and the default ring_size + 2 sample buffers, the actors of a run whose trainer binds fill
    the buffers freed by one batch while the update before it runs: every batch after the first few comes from a
    single policy two versions older than the trainer's. The inline runtime polls in that order."""
    cfg = load_config(CARTPOLE, ["runtime=inline", "run.total_env_steps=10240", "run.target_return=null"])
    controller = Controller(cfg, None, time.time(), progress=None)
    run_inline(make_plan(cfg), controller, None)
    lags = np.array(controller.record()["lag_histogram"])
    assert controller.policy_version >= 15
    assert lags[2] >= 0.85 * lags.sum() and lags[3:].sum() == 0, lags  # the first batches come before the lag


class _Clock:
    """The trainer's clock in the tests below: it moves only when the fake stream waits or the fake update runs,
    so what the trainer measures does not depend on how fast the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _Stream:
    """A sample stream of CartPole's fields whose segments are there at once, or after ``delay`` seconds."""

    def __init__(self, clock: _Clock, delay: float) -> None:
        self.fields = make_plan(load_config(CARTPOLE)).policies[0].layout.fields
        self.clock, self.delay = clock, delay

    def receive(self, max_segments: int, timeout: float | None) -> np.ndarray:
        self.clock.now += self.delay
        return np.zeros((max_segments, 2), np.int64)

    def segment(self, actor: int, buffer: int) -> dict[str, np.ndarray]:
        return {name: np.zeros(spec.shape, spec.dtype) for name, spec in self.fields.items()}

    def release(self, actor: int, buffer: int) -> None:
        pass

    def ring(self) -> None:
        pass

    def holds(self, actor: int, buffer: int) -> bool:
        return True  # every record names a fresh segment of zeros

    rejected = 0


class _ThreadsSeen:
    """An algorithm that records the torch threads each update ran on; with more threads an update takes
    ``more`` seconds of the clock, else 20 ms."""

    def __init__(self, clock: _Clock, more: float) -> None:
        self.seen: list[int] = []
        self.clock, self.more = clock, more

    def train(self, batch, progress):
        self.seen.append(torch.get_num_threads())
        self.clock.now += self.more if self.seen[-1] > 1 else 0.02
        return TrainResult({})

    def policy_state(self) -> np.ndarray:
        return np.zeros(4, np.float32)


def test_a_trainer_that_never_waits_takes_the_idle_cores_only_if_its_updates_run_faster(monkeypatch):
    """workers.autotune: when the segments are always there (the actors wait for the trainer), the trainer tries
    its share of the node's cores and keeps them while its updates run faster that way, giving them back after
    every update; when more threads slow it, it goes back to its own; when it waits for segments, or the switch
    is off, nothing changes."""
    from srl.base.seqlock import VersionedBuffer
    from srl.system import trainer_worker
    from srl.system.batches import SegmentBatches
    from srl.system.control import DirectReporter
    from srl.system.params import ParamPublisher
    from srl.system.trainer_worker import TrainerWorker

    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)

    def run(delay: float, peers: int, more: float) -> tuple[list[int], list[int]]:
        clock = _Clock()
        monkeypatch.setattr(trainer_worker, "time", clock)
        algo, reports = _ThreadsSeen(clock, more), []
        trainer = TrainerWorker(
            0, algo, SegmentBatches(_Stream(clock, delay), batch_segments=2, max_policy_lag=99),
            ParamPublisher(VersionedBuffer.in_process(4, np.float32)),
            DirectReporter(lambda kind, meta, *rest: reports.append(meta)), total_env_steps=10**9,
            autotune_peers=peers,
        )  # fmt: skip
        trainer.setup()
        for _ in range(16):  # a poll takes a batch of 2 segments, the next one updates: 8 updates
            trainer.poll()
            assert torch.get_num_threads() == 1  # given back after every update
        return algo.seen, [m["update_threads"] for m in reports if "update_threads" in m]

    if cores > 1:
        faster, reported = run(0.0, peers=1, more=0.005)
        assert faster == [1] + [cores] * 7 and reported == faster  # the first update has no cycle to judge by
        slower, _ = run(0.0, peers=1, more=0.06)
        assert slower == [1, cores] + [1] * 6  # tried once, slower: given back for good (until the 8th try)
    assert run(0.05, peers=1, more=0.005)[0] == [1] * 8  # it waits for segments: not the bottleneck
    assert run(0.0, peers=0, more=0.005)[0] == [1] * 8  # the switch is off
    assert run(0.0, peers=cores, more=0.005)[0] == [1] * 8  # as many trainers as cores: one thread each


def test_a_trainer_reports_its_first_update_then_once_per_interval_and_at_teardown_with_every_lag():
    """A replay's trainer updates many times a second, and each report wakes the controller: it reports at most
    once per ``report_interval`` (its first update at once), and at teardown its newest counters. The lag
    histograms of its reports together count every sample it trained on once."""
    from srl.base.seqlock import VersionedBuffer
    from srl.system.batches import SegmentBatches
    from srl.system.control import DirectReporter
    from srl.system.params import ParamPublisher
    from srl.system.trainer_worker import TrainerWorker

    clock, reports = _Clock(), []
    stream = _Stream(clock, 0.0)
    trainer = TrainerWorker(
        0, _ThreadsSeen(clock, 0.0), SegmentBatches(stream, batch_segments=2, max_policy_lag=99),
        ParamPublisher(VersionedBuffer.in_process(4, np.float32)),
        DirectReporter(lambda kind, meta, arrays: reports.append((meta, arrays))), total_env_steps=10**9,
        report_interval=3600.0,
    )  # fmt: skip
    trainer.setup()
    for _ in range(16):  # a poll takes a batch of 2 segments, the next one updates: 8 updates
        trainer.poll()
    trainer.teardown()
    assert [meta["updates"] for meta, _ in reports] == [1, 8]
    samples = 8 * 2 * int(np.prod(stream.fields["rewards"].shape))  # 8 updates of 2 segments
    assert sum(int(arrays["lag_hist"].sum()) for _, arrays in reports) == samples


def test_the_thread_handover_tries_the_other_count_again_every_few_updates():
    from srl.system.trainer_worker import EXPLORE_EVERY, ThreadHandover

    h = ThreadHandover(1, 4)
    picks = []
    for _ in range(2 * EXPLORE_EVERY):
        k = h.choose(0.0)
        picks.append(k)
        h.record(k, 0.01 if k == 4 else 0.03)
    assert picks[:2] == [4, 1] and picks.count(1) == 3  # measured once, then once every EXPLORE_EVERY tries
    assert picks[EXPLORE_EVERY - 1] == 1 and picks[2 * EXPLORE_EVERY - 1] == 1
    assert h.choose(0.5) == 1 and h.choose(None) == 1  # waiting, or no cycle yet: its own threads


@pytest.mark.parametrize("runtime", ["inline", "local"])
def test_run_directory_contract(tmp_path, runtime):
    cfg = load_config(CARTPOLE, [f"runtime={runtime}", *SMALL, "run.log_interval_seconds=0.2"])
    summary = train(cfg, tmp_path / "run", progress=None)
    run = tmp_path / "run"
    assert (run / "config.yaml").exists() and load_config(run / "config.yaml") == cfg
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    for key in ("env_steps", "wall_seconds", "train_fps", "final_eval_return_mean", "policy_version"):
        assert key in on_disk, key
    assert on_disk["env_steps"] >= 3000 and on_disk["stop_reason"] == "env_steps"
    w = cfg.workers  # every version is one update of one batch, and only trained samples are counted
    assert (
        on_disk["trained_samples"] == on_disk["policy_version"] * w.batch_segments * w.envs_per_slot * w.segment_length
    )
    assert 0 < on_disk["trained_samples_per_second"] <= on_disk["train_fps"] * 1.001
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records and records[-1]["env_steps"] == on_disk["env_steps"]
    assert list((run / "tb").glob("events.out.tfevents.*"))
    checkpoints = sorted((run / "checkpoints").glob("ckpt_*.pt"))
    assert checkpoints
    state = load_checkpoint(checkpoints[-1])
    assert state["version"] == on_disk["policy_version"]
    assert set(state["algorithm"]) == {"policy", "value", "optimizer", "rng"}


def _zip_without_torch_data(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/notes.txt", "hello")


def _truncated_torch_file(path: Path) -> None:
    torch.save({"format": CHECKPOINT_FORMAT, "w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:2000])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b""), "an empty file, not a checkpoint"),
        (lambda p: p.write_bytes(b"not a checkpoint"), "not a torch file (torch.save writes a zip archive)"),
        (_truncated_torch_file, "a truncated file (its zip directory, at the end, is missing)"),
        (_zip_without_torch_data, "a zip archive, not a torch file (no data.pkl in it)"),
        (
            lambda p: torch.save(torch.nn.Linear(2, 2), p),
            "not loadable as weights only (Unsupported global: GLOBAL torch.nn",
        ),
        (lambda p: torch.save({"something": 1}, p), "not a checkpoint of srl: no 'format' entry"),
        (
            lambda p: torch.save({"format": "srl-checkpoint-v1"}, p),
            "checkpoint format 'srl-checkpoint-v1'; this srl reads",
        ),
        (lambda p: torch.save({"format": CHECKPOINT_FORMAT}, p), "not a whole checkpoint of srl: no 'version' entry"),
    ],
)
def test_an_unreadable_checkpoint_says_what_the_file_is(tmp_path, make, message):
    path = tmp_path / "ckpt_00000005.pt"
    make(path)
    with pytest.raises(ValueError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_an_acting_checkpoint_needs_no_training_state(tmp_path):
    """The eval worker's ``best.pt`` holds what acting needs; resuming needs the algorithm's state besides."""
    state = {"format": CHECKPOINT_FORMAT, "version": 3, "policy_state": torch.zeros(2), "config": {}, "spaces": {}}
    torch.save(state, tmp_path / "best.pt")
    assert load_checkpoint(tmp_path / "best.pt", ACTING_ENTRIES)["version"] == 3
    with pytest.raises(ValueError, match="no 'samples' entry"):
        load_checkpoint(tmp_path / "best.pt")


def test_checkpoint_write_is_atomic(tmp_path):
    cfg = load_config(CARTPOLE, ["runtime=inline", *SMALL])
    train(cfg, tmp_path / "run", progress=None)
    ckpt_dir = tmp_path / "run" / "checkpoints"
    before = {p.name: p.read_bytes() for p in ckpt_dir.iterdir()}
    from srl.base import fileio

    def exploding_writer(f):
        f.write(b"partial")
        raise OSError("disk full")

    newest = checkpoints(ckpt_dir)[-1]
    with pytest.raises(OSError):
        fileio.atomic_save(newest, exploding_writer)
    after = {p.name: p.read_bytes() for p in ckpt_dir.iterdir()}
    assert after == before  # old checkpoint intact, no temp file left
    load_checkpoint(newest)


def _wait_for_updates(run: Path, versions: int = 2, timeout: float = 60.0) -> None:
    """Wait until the run's metrics show ``versions`` policy updates."""
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline:
        lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []  # complete lines only
        if any(json.loads(line).get("policy_version", 0) >= versions for line in lines):
            return
        time.sleep(0.2)
    pytest.fail("training did not start")


@pytest.mark.parametrize(
    "runtime, sig", [("local", signal.SIGINT), ("local", signal.SIGTERM), ("inline", signal.SIGTERM)]
)
@pytest.mark.slow
def test_signal_stops_cleanly(tmp_path, runtime, sig):
    run, private_tmp = tmp_path / "run", tmp_path / "tmp"
    private_tmp.mkdir()  # the run's own temporary folder: other runs on the machine cannot disturb the check
    proc = start_endless_training(run, f"runtime={runtime}", tmp=private_tmp)
    children: set[int] = set()
    try:
        _wait_for_updates(run)
        if runtime == "local":
            children = children_of(proc.pid)
            assert len(children) >= 2  # actor and trainer processes
            assert list(private_tmp.glob("srl-*"))  # the named pipes' folder
            assert [s for s in list_segments() if s.startswith(f"srl_{proc.pid}_")]
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted"
    assert summary["final_eval_return_mean"] is None  # no evaluation after an interrupt, but the key is there
    assert list((run / "checkpoints").glob("ckpt_*.pt"))
    assert not [c for c in children if Path(f"/proc/{c}").exists()]
    assert not [s for s in list_segments() if s.startswith(f"srl_{proc.pid}_")]
    assert not list(private_tmp.iterdir())  # the run's named pipes are gone


def test_a_signal_in_the_middle_of_a_step_lets_the_step_finish_then_stops_cleanly(tmp_path):
    """The inline runtime's SIGTERM handler asks for a stop; it does not raise inside whatever code the signal
    lands in (there, an import cut off halfway once broke the final metrics record)."""
    from srl.envs.testing import SignalAt

    SignalAt.sent, SignalAt.finished_after_signal = False, 0
    cfg = load_config(
        CARTPOLE,
        [
            "runtime=inline",
            "env.id=srl.envs.testing:signalling_cartpole",
            "env.kwargs={at: 700}",
            "run.target_return=null",
            "run.total_env_steps=100000000",
        ],
    )
    before = signal.getsignal(signal.SIGTERM)  # another library's (Ray's, after a Ray test) or the default
    summary = train(cfg, tmp_path / "run", progress=None)
    assert SignalAt.finished_after_signal == 1  # the one step that sent it ran to its end
    assert summary["stop_reason"] == "interrupted" and "error" not in summary
    assert summary["final_eval_return_mean"] is None
    assert list((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is given back


def test_max_train_seconds_counts_from_the_first_env_step_and_max_wall_seconds_from_the_start():
    """However long start-up took, ``run.max_train_seconds`` starts counting at the first env step an actor
    reports; ``run.max_wall_seconds`` counts from the process's start. Time moves by shifting the clock marks."""
    # margins of minutes between the marks and the limit, so no pause of a loaded machine can change an answer
    cfg = load_config(CARTPOLE, [*SMALL, "run.total_env_steps=1000000", "run.max_train_seconds=600"])
    controller = reporting(Controller(cfg, None, time.time() - 3600.0, progress=None))  # an hour of start-up
    assert controller.should_stop() is None
    controller.handle("actor", {"worker": "actor0", "env_steps": 0}, {})
    assert controller.should_stop() is None  # no env step yet: the clock has not started
    controller.handle("actor", {"worker": "actor0", "env_steps": 64}, {})
    assert controller.should_stop() is None
    assert controller.tally.first_step_at is not None
    controller.tally.first_step_at -= 300.0
    assert controller.should_stop() is None
    controller.tally.first_step_at -= 400.0
    assert controller.should_stop() == "train_time"
    walled = Controller(load_config(CARTPOLE, [*SMALL, "run.max_wall_seconds=5"]), None, time.time() - 6.0, None)
    assert walled.should_stop() == "wall_time"  # from the start, with no env step at all
    with pytest.raises(ConfigError, match="run.max_train_seconds"):
        load_config(CARTPOLE, ["run.max_train_seconds=0"])


def test_the_first_signal_asks_for_a_stop_the_second_raises_and_the_handlers_are_given_back():
    cfg = load_config(CARTPOLE, SMALL)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for first, second in ((signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGTERM)):
        controller = Controller(cfg, None, time.time(), progress=None)
        with pytest.raises(KeyboardInterrupt), stop_on_signals(controller):
            signal.raise_signal(first)
            assert controller.stop_reason == "interrupted"
            signal.raise_signal(second)
            pytest.fail("the second signal did not raise")
        assert {s: signal.getsignal(s) for s in before} == before
    solved = Controller(cfg, None, time.time(), progress=None)
    solved.stop_reason = "solved"  # a run already stopping for its own reason keeps it, and still hears a second
    with pytest.raises(KeyboardInterrupt), stop_on_signals(solved):
        signal.raise_signal(signal.SIGTERM)
        assert solved.stop_reason == "solved"
        signal.raise_signal(signal.SIGTERM)
    entered = []

    def off_the_main_thread() -> None:  # Python refuses handlers there (ValueError): the block installs none
        with stop_on_signals(Controller(cfg, None, time.time(), progress=None)):
            entered.append({s: signal.getsignal(s) for s in before})

    thread = threading.Thread(target=off_the_main_thread)
    thread.start()
    thread.join()
    assert entered == [before]


@pytest.mark.slow
def test_nothing_of_a_run_killed_with_sigkill_remains_after_the_next_run(tmp_path):
    """kill -9 of a whole run leaves its pipe folder (pipes, sockets, token) and its segments; the next
    ``srl train`` on the machine removes them."""
    run, private_tmp = tmp_path / "run", tmp_path / "tmp"
    private_tmp.mkdir()  # the runs' own temporary folder: other runs on the machine cannot disturb the check
    proc = start_endless_training(run, "runtime=local", tmp=private_tmp, new_session=True)
    try:
        _wait_for_updates(run)
        dead = {proc.pid, *children_of(proc.pid)}
        (pipe_dir,) = private_tmp.glob(f"srl-{proc.pid}-*")
        assert (pipe_dir / "token").is_file() and any(p.is_fifo() for p in pipe_dir.iterdir())
        assert [s for s in list_segments() if s.startswith(f"srl_{proc.pid}_")]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in dead):
        assert time.monotonic() < deadline, "killed workers still running"
        time.sleep(0.1)
    assert pipe_dir.exists()  # nothing cleaned up after a SIGKILL: the next run's job

    short = ["runtime=local", "run.total_env_steps=500", "run.target_return=null", "run.eval_episodes=0"]
    cmd = [sys.executable, "-m", "srl.cli.main", "train", CARTPOLE, "--quiet", "--run-dir", str(tmp_path / "next")]
    done = subprocess.run(
        [*cmd, *[a for o in short for a in ("--set", o)]],
        capture_output=True,
        text=True,
        env=dict(os.environ, TMPDIR=str(private_tmp)),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not list(private_tmp.iterdir())  # the dead run's folder swept, the new run's removed at its exit
    assert not [s for s in list_segments() if any(s.startswith(f"srl_{pid}_") for pid in dead)]


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stop_request_ends_the_run_as_requested_and_it_is_evaluated(tmp_path):
    """``train(..., stop=event)``: another thread ends a run that no budget would end, by a condition it saw."""
    run = tmp_path / "run"
    endless = ["runtime=inline", "run.total_env_steps=100000000", "run.target_return=null", "run.eval_episodes=2"]
    cfg = load_config(CARTPOLE, [*endless, "run.log_interval_seconds=0.2"])
    stop, out = threading.Event(), {}
    thread = threading.Thread(target=lambda: out.update(train(cfg, run, progress=None, stop=stop)))
    thread.start()
    try:
        _wait_for_updates(run, versions=2)
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert out["stop_reason"] == "requested" and out["policy_version"] >= 2
    assert out["final_eval_return_mean"] is not None  # a requested end is evaluated, unlike an interrupt
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "requested"


def test_local_runtime_with_several_policy_workers_serves_every_actor(tmp_path):
    cfg = load_config(
        CARTPOLE,
        [
            "workers.actors=3",
            "workers.policy_workers=2",
            "workers.ring_size=2",
            "run.total_env_steps=6000",
            "run.target_return=null",
            "run.eval_episodes=0",
        ],
    )
    plan = make_plan(cfg)
    controller = Controller(cfg, None, time.time(), progress=None)
    from srl.runtime.local import run_local

    snapshot = run_local(plan, controller, None)
    assert controller.error is None and snapshot is not None
    assert controller.env_steps >= 6000 and all(controller.worker_env_steps(f"actor{a}") > 0 for a in range(3))
    record = controller.record()
    assert sorted(k for k in record if k.endswith("_mean_batch")) == ["policy0_mean_batch", "policy1_mean_batch"]
    assert record["policy0_mean_batch"] > 0 and record["policy1_mean_batch"] > 0
    assert controller.policy_version >= 3


def test_continuous_actions_run_end_to_end(tmp_path):
    cfg = load_config(
        CARTPOLE,
        [
            "env.id=Pendulum-v1",
            "runtime=inline",
            "run.total_env_steps=3072",  # the first update comes once the pipeline is full (1536 steps), then each 512
            "run.target_return=null",
            "run.eval_episodes=2",
        ],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["policy_version"] >= 3 and summary["stop_reason"] == "env_steps"
    assert -2000 < summary["final_eval_return_mean"] <= 0  # Pendulum returns are negative


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["inline", "local"])
def test_worker_failure_ends_the_run_with_one_clear_error(tmp_path, runtime):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "train",
            CARTPOLE,
            "--quiet",
            "--run-dir",
            str(tmp_path / "run"),
            "--set",
            f"runtime={runtime}",
            "--set",
            "env.id=srl.envs.testing:crashing_cartpole",
            "--set",
            "env.kwargs={crash_after: 300}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("srl: error: ") and "injected failure at step 300" in last, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and "injected failure" in summary["error"]


def test_a_run_directory_is_never_shared(tmp_path):
    cfg = load_config(
        CARTPOLE, ["runtime=inline", "run.total_env_steps=600", "run.target_return=null", "run.eval_episodes=0"]
    )
    train(cfg, tmp_path / "run", progress=None)
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "train", CARTPOLE, "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"srl: error: {tmp_path / 'run'}: already holds a run; choose another run directory"


@pytest.mark.slow
def test_exec_start_method_runs_workers_in_fresh_interpreters(tmp_path):
    cfg = load_config(
        CARTPOLE,
        [
            "workers.start_method=exec",
            "workers.policy_workers=1",
            "run.total_env_steps=4000",
            "run.target_return=null",
            "run.eval_episodes=2",
        ],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["stop_reason"] == "env_steps" and summary["policy_version"] >= 3
    assert summary["final_eval_return_mean"] > 0
    assert list((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))


@pytest.mark.parametrize("mode", ["fail", "sanitize"])
def test_nonfinite_env_output_fails_naming_it_or_is_sanitized_and_counted(tmp_path, mode):
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "runtime=inline",
            "env.id=srl.envs.testing:nonfinite_cartpole",
            f"env.nonfinite={mode}",
            "run.target_return=null",
            "run.total_env_steps=3000",
            "run.eval_episodes=0",
        ],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    if mode == "fail":
        assert summary["stop_reason"] == "error"
        assert (
            "env srl.envs.testing:nonfinite_cartpole: non-finite observation and reward at actor 0" in summary["error"]
        )
    else:
        assert summary["stop_reason"] == "env_steps" and "error" not in summary
        # Every 50th step of each of the 16 envs (2 slots x 8), up to the partial interval each env is in.
        assert summary["env_steps"] // 50 - 16 <= summary["nonfinite_steps"] <= summary["env_steps"] // 50
        assert summary["policy_version"] >= 2  # and training went on with finite numbers


def test_observations_that_stop_matching_their_space_fail_naming_the_env(tmp_path):
    cfg = load_config(
        CARTPOLE,
        [
            "runtime=inline",
            "env.id=srl.envs.testing:misshapen_cartpole",
            "run.total_env_steps=3000",
            "run.eval_episodes=0",
        ],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["stop_reason"] == "error"
    # Gymnasium's vector env notices first; the message names our env and where, and keeps Gymnasium's words.
    assert "env srl.envs.testing:misshapen_cartpole: step failed at actor 0 slot 0" in summary["error"]
    assert "wrong shape" in summary["error"]


def test_each_record_names_the_stage_the_run_waits_on_now() -> None:
    """Busy shares per worker over each metrics interval (everything but waiting for work), and the kind of worker
    the run waits on: the busiest on average. It follows the interval, not the whole run, which the summary
    gives; a restarted worker's counters going back give no share."""
    from srl.system.controller import Controller, bottleneck, busy_fraction

    assert busy_fraction({"total": 10.0, "wait": 2.5, "env": 7.0}) == 0.75
    assert busy_fraction({"total": 10.0, "wait": 3.0}, {"total": 6.0, "wait": 2.0}) == 0.75  # 3 of 4 s busy
    assert busy_fraction({"total": 4.0, "decide": 1.0}) == 0.25  # a stage: busy in the phases it names
    assert busy_fraction({"total": 1.0, "wait": 0.5}, {"total": 5.0, "wait": 1.0}) is None  # restarted
    roles = {"actor0": "actor", "actor1": "actor", "trainer0": "trainer", "policy0": "policy"}
    assert bottleneck({"actor0": 0.2, "actor1": 0.4, "trainer0": 0.35, "policy0": None}, roles) == "trainer"
    assert bottleneck({}, roles) is None

    cfg = load_config(CARTPOLE, ["runtime=inline", "workers.actors=2"])
    controller = reporting(Controller(cfg, None, time.time(), progress=None))

    def report(t: float, actor_wait: float, trainer_wait: float) -> None:
        for a in ("actor0", "actor1"):
            controller.handle("actor", {"worker": a, "env_steps": 0, "t_total": t, "t_wait": actor_wait}, {})
        meta = {"worker": "trainer0", "trainer": 0, "version": 0, "t_total": t, "t_wait": trainer_wait, "t_train": 0.0}
        controller.handle("trainer", meta, {})

    report(10.0, actor_wait=8.0, trainer_wait=0.5)  # the actors wait for the trainer
    first = controller.record()
    assert first["busy/actor0"] == pytest.approx(0.2) and first["busy/trainer0"] == pytest.approx(0.95)
    assert first["bottleneck"] == "trainer"
    report(20.0, actor_wait=8.5, trainer_wait=9.0)  # then the trainer waits for the actors
    second = controller.record()
    assert second["busy/actor0"] == pytest.approx(0.95) and second["busy/trainer0"] == pytest.approx(0.15)
    assert second["bottleneck"] == "actor"
    assert controller.summary(None)["bottleneck"] == "actor"  # over the whole run: 57.5% busy against 55%
