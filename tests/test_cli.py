"""``srl train`` as a user meets it: signals from its first line on, its clock, its progress output."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, last_record, reporting, start_endless_training, wait_while_running

from srl.api.config import load_config
from srl.base.shm import list_segments
from srl.base.stop_signals import held, listening, shielded
from srl.system.controller import Controller

CARTPOLE = str(ROOT / "configs" / "cartpole_ppo.yaml")
TINY = ["runtime=inline", "run.total_env_steps=512", "run.target_return=null", "run.eval_episodes=0"]


def _train_command(config: str | Path, run: Path, *overrides: str) -> list[str]:
    sets = [a for o in overrides for a in ("--set", o)]
    return [sys.executable, "-m", "srl.cli.main", "train", str(config), "--quiet", "--run-dir", str(run), *sets]


def _left_behind(pid: int, run: Path) -> list[str]:
    """What a finished run left: processes of its own (forked workers keep the command line, which names the
    run directory) and shared memory segments named after it."""
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run).encode() in cmdline.read_bytes():
                alive.append(cmdline.parent.name)
        except OSError:  # ended while we looked
            pass
    return alive + [s for s in list_segments() if s.startswith(f"srl_{pid}_")]


def _start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _reaped(proc: subprocess.Popen) -> Iterator[None]:
    """Whatever happens in the block, ``proc`` does not outlive it."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _open_for_writing(fifo: Path, proc: subprocess.Popen) -> int:
    """The write end of ``fifo``, once ``proc`` has opened it to read."""
    fd: list[int] = []

    def opened() -> bool:
        try:
            fd.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        return bool(fd)

    wait_while_running(opened, proc)
    return fd[0]


def test_sigterm_before_the_config_is_read_exits_130_and_leaves_nothing(tmp_path):
    """The config is a named pipe: ``srl train`` blocks reading it, past its imports but before any run exists,
    and gets SIGTERM there."""
    fifo, run = tmp_path / "config.yaml", tmp_path / "run"
    os.mkfifo(fifo)
    proc = _start(_train_command(fifo, run))
    with _reaped(proc):
        fd = _open_for_writing(fifo, proc)
        proc.send_signal(signal.SIGTERM)
        os.close(fd)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip() == "srl: interrupted"
    assert not run.exists() and not _left_behind(proc.pid, run)


@pytest.mark.slow
def test_sigterm_while_the_run_starts_stops_it_cleanly_with_130(tmp_path):
    """The env sends SIGTERM when the controller first makes it (before the run directory and any worker exist):
    the run starts, stops at once as interrupted, and leaves nothing behind."""
    run = tmp_path / "run"
    sets = ["runtime=local", "env.id=srl.envs.testing:cartpole_signalling_when_made", "run.target_return=null"]
    proc = _start(_train_command(CARTPOLE, run, *sets))
    with _reaped(proc):
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and "error" not in summary
    assert not _left_behind(proc.pid, run)


@pytest.mark.slow
def test_an_inherited_ignored_sigint_stays_ignored_and_sigterm_still_stops_the_run(tmp_path):
    """``srl train ... &`` from a script starts with SIGINT ignored: it stays so for the whole run."""
    run = tmp_path / "run"

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = start_endless_training(run, "runtime=local", preexec_fn=ignore_sigint)
    with _reaped(proc):
        wait_while_running(lambda: last_record(run).get("policy_version", 0) >= 2, proc)
        assert _ignored(proc.pid, signal.SIGINT) and not _ignored(proc.pid, signal.SIGTERM)
        proc.send_signal(signal.SIGINT)
        version = last_record(run)["policy_version"]
        wait_while_running(lambda: last_record(run).get("policy_version", 0) >= version + 3, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "interrupted"
    assert not _left_behind(proc.pid, run)


def test_a_signal_while_a_run_starts_is_kept_for_it_and_one_no_run_takes_ends_the_command():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stops: list[str] = []
    with held():  # a run is starting
        signal.raise_signal(signal.SIGTERM)
        with held(lambda: stops.append("run")):  # it begins: the signal is its stop
            assert stops == ["run"]
    assert {s: signal.getsignal(s) for s in before} == before
    with pytest.raises(KeyboardInterrupt), held():  # no run began to take it: it ends the block
        signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), listening():  # outside a run: raised where it lands
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("the signal did not raise")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with held(lambda: stops.append("ignored")):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
        assert stops == ["run"]
    finally:
        signal.signal(signal.SIGINT, before[signal.SIGINT])


def _ignored(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores ``sig`` (the kernel's view: ``SigIgn`` in /proc/PID/status)."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigIgn:"))
    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)


@pytest.mark.slow
def test_wall_seconds_leave_out_the_shell_that_execs_srl(tmp_path):
    """A shell that sleeps and then execs ``srl train`` hands over its process, and the process's start with it:
    the sleep is not the run's. Two clock marks bound what srl may count: the shell's, written just before the
    exec, and ``summary.json``'s modification time, just after the summary's own clock mark."""
    run, exec_at = tmp_path / "run", tmp_path / "exec_at"
    command = " ".join(_train_command(CARTPOLE, run, *TINY))
    proc = subprocess.run(["bash", "-c", f"sleep 1; date +%s.%N > {exec_at}; exec {command}"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = run / "summary.json"
    counted = json.loads(summary.read_text())["wall_seconds"]
    coarse = 0.05  # a file's modification time comes from a coarser clock, a tick or so behind
    assert 0 < counted <= summary.stat().st_mtime - float(exec_at.read_text()) + coarse


class _Stream(io.StringIO):
    """stderr as a terminal (``tty``) or as a file."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _progress(tty: bool) -> tuple[_Stream, Controller]:
    """Three progress records with a warning between the second and the third."""
    stream = _Stream(tty)
    controller = Controller(load_config(CARTPOLE, TINY), None, time.time(), progress=stream)
    controller.tick(force=True)
    controller.tick(force=True)
    controller.warn("careful")
    controller.tick(force=True)
    return stream, controller


def test_progress_is_rewritten_in_place_on_a_terminal():
    stream, controller = _progress(tty=True)
    first, second, third = stream.getvalue().split("\r")[1:]
    assert first.startswith("[") and "\n" not in first
    assert second.endswith("\nwarning: careful\n")
    assert third.startswith("[") and "\n" not in third
    controller.line.end()  # the run's end: what follows starts on a line of its own
    assert stream.getvalue().endswith(third + "\n")


def test_progress_to_a_file_is_one_plain_line_per_record():
    stream, controller = _progress(tty=False)
    out = stream.getvalue()
    lines = out.split("\n")
    assert "\r" not in out and lines[-1] == ""  # every line ended, no line rewritten
    assert [line.startswith("[") for line in lines[:-1]] == [True, True, False, True]
    assert lines[2] == "warning: careful"
    assert all(line == line.rstrip() for line in lines)
    controller.line.end()
    assert stream.getvalue() == out  # no empty line at the end


@pytest.mark.slow
@pytest.mark.parametrize("config", ["cartpole_ppo.yaml", "cartpole_dqn.yaml"])
def test_a_second_signal_ends_the_wait_for_slow_workers_and_still_leaves_the_summary_and_nothing_else(tmp_path, config):
    """The actor's envs take a minute to close, so the first SIGINT leaves the run waiting for it; a second one,
    sent once the closing has begun, ends the wait: the workers are killed, shared memory (a replay's storage
    too) and pipes removed, the summary written, exit 130."""
    run, closing = tmp_path / "run", tmp_path / "closing"
    sets = ["env.id=srl.envs.testing:slow_closing_cartpole", f"env.kwargs={{closing: {closing}}}"]
    endless = ["run.total_env_steps=100000000", "run.log_interval_seconds=0.2", "run.eval_episodes=0"]
    proc = _start(_train_command(ROOT / "configs" / config, run, "runtime=local", *endless, *sets))
    with _reaped(proc):
        wait_while_running(lambda: last_record(run).get("policy_version", 0) >= 2, proc)
        proc.send_signal(signal.SIGINT)
        wait_while_running(closing.exists, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # well before the envs would have closed
    assert proc.returncode == 130, err
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "interrupted"
    assert not _left_behind(proc.pid, run)


def test_a_signal_during_a_shielded_cleanup_raises_only_once_the_cleanup_is_done():
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt), held(lambda: steps.append("stop")):
        signal.raise_signal(signal.SIGINT)  # the first: the run's stop
        with shielded():
            signal.raise_signal(signal.SIGINT)  # the second lands in the cleanup
            steps.append("cleaned up")
        pytest.fail("the kept signal did not raise as the cleanup ended")
    assert steps == ["stop", "cleaned up"]
    with pytest.raises(KeyboardInterrupt), held(lambda: None):  # a third signal is not kept waiting
        signal.raise_signal(signal.SIGINT)
        with shielded():
            signal.raise_signal(signal.SIGINT)  # kept
            steps.append("cleaning up")
            signal.raise_signal(signal.SIGINT)  # raises
            pytest.fail("the third signal was kept")
    assert steps[-1] == "cleaning up"


@pytest.mark.slow
def test_ctrl_c_stops_a_script_that_trains_in_a_loop_through_the_python_api(tmp_path):
    """``srl.train`` stops the run cleanly, writes its summary, and then raises KeyboardInterrupt: the script's
    loop does not go on to its next run."""
    script = tmp_path / "loop.py"
    script.write_text(
        "import srl\n"
        "for seed in (1, 2):\n"
        f"    srl.train({CARTPOLE!r}, [f'seed={{seed}}', 'run.total_env_steps=100000000', 'run.target_return=null',\n"
        "               'run.log_interval_seconds=0.2'], run_dir=f'run{seed}')\n"
        "print('the loop went on')\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    with _reaped(proc):
        wait_while_running(lambda: last_record(tmp_path / "run1").get("policy_version", 0) >= 2, proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode in (130, -signal.SIGINT), err  # an uncaught KeyboardInterrupt ends Python as SIGINT does
    assert "KeyboardInterrupt" in err and "the loop went on" not in out
    assert json.loads((tmp_path / "run1" / "summary.json").read_text())["stop_reason"] == "interrupted"
    assert not (tmp_path / "run2").exists()


def test_the_progress_line_shows_a_dash_for_the_return_before_any_episode_ended():
    stream, _ = _progress(tty=False)
    assert "return        -  episodes      0" in stream.getvalue() and "nan" not in stream.getvalue()


def test_metrics_records_come_often_while_training_is_young(tmp_path):
    """An eighth of the training time so far between records (at least 0.1 s), up to ``log_interval_seconds``:
    a run of a few seconds draws its curves from a dozen points."""
    cfg = load_config(CARTPOLE, [*TINY, "run.log_interval_seconds=2.0"])
    controller = reporting(Controller(cfg, None, time.time(), progress=None))
    now = time.time()
    assert controller.record_interval(now) == 2.0  # nothing trains yet
    controller.handle("actor", {"worker": "actor0", "env_steps": 64}, {})  # the first env steps: training starts
    assert controller.record_interval(time.time()) == pytest.approx(0.1)
    start = controller.tally.first_step_at
    assert controller.record_interval(start + 4.0) == pytest.approx(0.5)
    assert controller.record_interval(start + 60.0) == 2.0
