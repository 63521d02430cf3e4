"""The plugin points and the Python API, used as a user would: examples/, the README's Python block, any space."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from conftest import last_record, wait_while_running, worker_pids

import srl
from srl.api.config import ConfigError, ExperimentConfig, build
from srl.envs.testing import goal_grid
from srl.loaded import LoadedPolicy
from srl.wiring import acting_policy

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = "configs/cartpole_ppo.yaml"


def _train(config: str, tmp_path: Path, *overrides: str) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "train",
            config,
            "--run-dir",
            str(tmp_path / "run"),
            "--quiet",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The plugin examples learn under the inline runtime: deterministic given the seed, so whether they solve cannot
# depend on how fast (or how loaded) the machine is, as asynchronous actors' policy lag does.
INLINE = ("--set", "runtime=inline")


@pytest.mark.slow
def test_custom_algorithm_a2c_solves_cartpole(tmp_path):
    summary = _train("examples/a2c.yaml", tmp_path, *INLINE)
    assert summary["solved"] and summary["solved_return_mean"] >= 475, summary
    # A plugin algorithm's checkpoints carry its acting policy: srl eval plays it without knowing A2C.
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "eval", str(tmp_path / "run"), "--episodes", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["return_mean"] > 200


@pytest.mark.slow
def test_custom_network_trains_cartpole(tmp_path):
    summary = _train("examples/custom_network.yaml", tmp_path, *INLINE)
    assert summary["solved"] and summary["solved_return_mean"] >= 475, summary
    ckpt = next((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))
    from srl.system.checkpoint import load_checkpoint

    keys = load_checkpoint(ckpt)["algorithm"]["policy"]
    assert any(k.startswith("encoder.blocks.") for k in keys)  # the plugin's own layers were trained


@pytest.mark.slow
def test_custom_dataflow_a_stage_drops_stale_segments():
    """examples/fresh_segments.yaml adds a stage by configuration, and solves under the inline runtime
    (deterministic). Its segments reach the stage fresh there, as in a run whose trainer binds; with staleness
    injected (the policy worker moves on only every third version), those acted two versions back are dropped by
    the stage, and counted as its decisions, not as losses."""
    summary = srl.train("examples/fresh_segments.yaml", ["runtime=inline"], run_dir=None)
    assert summary["solved"] and summary["solved_return_mean"] >= 475, summary
    assert summary["stages"]["stage0"]["kept"] > 0
    stale = ["runtime=inline", "stage.args.max_lag=1", "workers.param_version_stride=3", "run.total_env_steps=8192"]
    summary = srl.train("examples/fresh_segments.yaml", stale, run_dir=None)
    stage = summary["stages"]["stage0"]
    assert stage["kept"] > 0 and stage["dropped"] > 0 and stage["stage_mean_lag"] > 1, stage
    assert summary["dropped_segments"] == 0  # the stage's decisions are not losses


@pytest.mark.slow
def test_custom_dataflow_under_local_a_killed_stage_restarts_alone(tmp_path):
    """The same file under the local runtime: the stage is its own process; killed with -9 mid-run, it restarts
    alone and the run solves. The trainer is frozen (SIGSTOP) from the first env steps (the first snapshot is out)
    until the stage is back, so the run cannot solve first however fast the machine; the actors fill the pool
    meanwhile, so the stage has kept segments before it is killed."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "srl.cli.main", "train", "examples/fresh_segments.yaml", "--quiet"]
    cmd += ["--run-dir", str(run), "--set", "run.log_interval_seconds=0.1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        wait_while_running(lambda: last_record(run).get("env_steps", 0) > 0, proc)
        first = worker_pids(run)
        os.kill(first["trainer0"], signal.SIGSTOP)
        wait_while_running(lambda: last_record(run).get("stage0_kept", 0) > 0, proc)
        os.kill(first["stage0"], signal.SIGKILL)
        wait_while_running(lambda: worker_pids(run).get("stage0") not in (None, first["stage0"]), proc)
        os.kill(first["trainer0"], signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["solved"] and summary["solved_return_mean"] >= 475, summary
    assert summary["restarts"] == {"stage0": 1}, summary
    assert summary["stages"]["stage0"]["kept"] > 0


# examples/policy_churn.py: a role that is not on the sample path, with a report kind of its own, added by one line
# of config (workers.roles). No file of srl/ names it. The Ray runtime's run of it is in test_ray.py.
ENDLESS = ("run.total_env_steps=100000000", "run.target_return=null")


def test_a_role_added_by_config_reports_under_the_inline_runtime():
    summary = srl.train("examples/policy_churn.yaml", ["runtime=inline", "run.total_env_steps=4096"], run_dir=None)
    churn = summary["churn"]
    assert churn["versions"] >= 2 and 0.0 <= churn["mean"] <= 1.0, churn
    assert summary["restarts"] == {}


@pytest.mark.slow
def test_a_role_added_by_config_under_local_is_its_own_process_and_restarts_alone(tmp_path):
    """kill -9 of the role's worker: it is restarted alone, counted, and reports again (a version after the one
    it measured before it died), into the records and the summary."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "srl.cli.main", "train", "examples/policy_churn.yaml", "--quiet"]
    cmd += ["--run-dir", str(run), "--set", "run.log_interval_seconds=0.1"]
    cmd += [a for s in ENDLESS for a in ("--set", s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        wait_while_running(lambda: "churn" in last_record(run), proc)
        first = worker_pids(run)
        assert set(first) == {"trainer0", "actor0", "churn0"}
        os.kill(first["churn0"], signal.SIGKILL)
        wait_while_running(lambda: worker_pids(run).get("churn0") not in (None, first["churn0"]), proc)
        measured = last_record(run)["churn_version"]
        wait_while_running(lambda: last_record(run).get("churn_version", -1) > measured + 1, proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == {"churn0": 1}, summary
    assert summary["churn"]["versions"] >= 3 and last_record(run)["restarts"] == 1
    assert any(w.startswith("churn0") and "restarted (1)" in w for w in summary["warnings"]), summary["warnings"]


def test_the_how_to_add_a_role_example_is_the_examples_code_and_runs_as_written(tmp_path):
    """docs/architecture.md, "How to add a role": its code is the example's (line for line), and its command,
    run as written from a folder holding ``examples/``, trains a run whose summary has the role's part."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("### How to add a role", 1)[1].split("\n## ", 1)[0]
    code = (ROOT / "examples" / "policy_churn.py").read_text().splitlines()
    source = {line.split("  # ")[0].strip() for line in code}  # the doc leaves the comments out
    shown = [line.strip() for block in re.findall(r"```python\n(.*?)```", section, re.S) for line in block.splitlines()]
    assert shown and [line for line in shown if line not in source] == []
    (command,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").glob("cartpole_policy_churn-*")
    churn = json.loads((run / "summary.json").read_text())["churn"]
    assert churn["versions"] >= 2 and 0.0 <= churn["last"] <= 1.0, churn


@pytest.mark.parametrize(
    ("role", "says"),
    [
        ("examples.policy_churn:PROBES", "is not a Role declaration (got int)"),
        ("examples.fresh_segments:FreshSegments", "is not a Role declaration (got type)"),
        ("examples.policy_churn:NOPE", "NOPE"),
        ("srl.replay.role:REPLAY", "stands on the sample path: list it in workers.path"),
        ("srl.eval.role:EVAL", "is built in: every run declares it"),
        ("examples.policy_churn:CHURN, examples.policy_churn:CHURN", "is listed twice"),
    ],
)
def test_a_role_config_cannot_take_is_one_line_before_anything_starts(tmp_path, role, says):
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "train", "examples/policy_churn.yaml", "--run-dir", str(tmp_path / "r"),
         "--set", f"workers.roles=[{role}]"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("runtime", ["inline", "local"])
def test_dict_observations_and_multidiscrete_actions_learn(tmp_path, runtime):
    """Both observation parts matter (see GoalGrid): without either, the return stays below 0.46."""
    summary = srl.train("configs/goal_grid_ppo.yaml", [f"runtime={runtime}"], run_dir=tmp_path / "run")
    assert summary["solved"] and summary["solved_return_mean"] >= 0.75, summary


@pytest.mark.slow
def test_dict_observations_through_a_policy_worker(tmp_path):
    summary = srl.train(
        "configs/goal_grid_ppo.yaml", ["workers.policy_workers=1", "workers.actors=2"], run_dir=tmp_path / "run"
    )
    assert summary["solved"], summary
    policy = srl.load_policy(tmp_path / "run")
    env = goal_grid()
    obs, _ = env.reset(seed=3)
    action = policy.act(obs)
    assert env.action_space.contains(action)
    batch = {"position": np.stack([obs["position"]] * 5), "goal": np.full(5, obs["goal"])}
    actions = policy.act(batch)
    assert actions.shape == (5, 2) and (actions == action).all()  # greedy: the same observation, the same action


def _readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


@pytest.mark.slow
def test_readme_shell_blocks_run_as_written_one_after_the_other(tmp_path):
    """Every ``bash`` block of the README, run as written by bash in one folder, in order: the quick start trains
    and solves, and the next block plays, plots and resumes its run. The test command is the one ``.ci/run``
    runs (it is not run again from inside the suite). ``pip`` is the one thing not run: this checkout is installed
    already, and a test must not reinstall it; a stand-in records what the README asks of it instead."""
    blocks = _readme_blocks("bash")
    quick, tests, *rest = blocks
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() == "pip install -e '.[test]' && " + ci.strip().splitlines()[-1]
    assert " ".join(quick.split()) == "pip install -e . && srl train configs/cartpole_ppo.yaml"
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "pip").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "pip_calls"}\n')
    (shims / "pip").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    env = dict(os.environ, PATH=f"{shims}{os.pathsep}{os.environ['PATH']}")
    for block in (quick, *rest):
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, (block, proc.stderr[-3000:])
    runs = sorted((work / "runs").glob("cartpole_ppo-*"))
    assert len(runs) == 1 and (work / "curves.png").stat().st_size > 0
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["stop_reason"] == "env_steps" and summary["env_steps"] >= 100000  # trained on after the resume
    extras = {"", "[test]", "[plot]"}  # what the test extra installs, and so CI before this test
    calls = (tmp_path / "pip_calls").read_text().splitlines()
    assert calls and all(c.startswith("install -e .") and c.removeprefix("install -e .") in extras for c in calls)


@pytest.mark.slow
def test_readme_python_api_block_runs_and_runs_again(tmp_path):
    """The README's Python API block, as written, run twice from one folder: the first run solves; the second,
    with the config's budget cut (it only has to start and finish), trains into a run directory of its own."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", block, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    def run() -> list[str]:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                              env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    (tmp_path / "configs").symlink_to(ROOT / "configs")
    solved, ret = run()
    assert solved.startswith("solved: True")
    assert float(ret.removeprefix("return:")) >= 475
    (tmp_path / "configs").unlink()
    short = yaml.safe_load((ROOT / CARTPOLE).read_text())
    short["run"]["total_env_steps"] = 1024
    (tmp_path / "configs").mkdir()
    (tmp_path / CARTPOLE).write_text(yaml.safe_dump(short))
    assert run()[0].startswith("solved: False")
    assert len(list((tmp_path / "runs").glob("*/summary.json"))) == 2
    with pytest.raises(ConfigError) as raised:  # from Python, the error names no command-line flag
        srl.train(tmp_path / CARTPOLE, run_dir=next((tmp_path / "runs").iterdir()))
    assert str(raised.value).endswith("already holds a run; choose another run directory")


def test_load_policy_acts_for_one_observation_and_for_a_batch(tmp_path):
    srl.train(
        "configs/pendulum_ppo.yaml",
        ["runtime=inline", "run.total_env_steps=4096", "run.target_return=null"],  # the first update at 3072
        run_dir=tmp_path / "run",
    )
    policy = srl.load_policy(tmp_path / "run")
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=0)
    action = policy.act(obs)
    assert action.shape == (1,) and env.action_space.contains(action)  # clipped to the bounds
    batch = policy.act(np.stack([obs] * 4), deterministic=False)
    assert batch.shape == (4, 1) and all(env.action_space.contains(a) for a in batch)
    assert policy.version > 0 and policy.checkpoint.endswith(".pt")


def _loaded(obs_space: gym.spaces.Space, agents: list[str] | None = None) -> LoadedPolicy:
    """A loaded policy of untrained weights for ``obs_space`` (shape checks need no training)."""
    action_space = gym.spaces.Discrete(3)
    cfg = build(ExperimentConfig, {})
    info = {"version": 0, "checkpoint": "none.pt"}
    return LoadedPolicy(acting_policy(obs_space, action_space, cfg), cfg, obs_space, action_space, np.asarray, info,
                        agents)  # fmt: skip


@pytest.mark.parametrize(
    "obs,message",
    [
        (np.zeros(3), r"^act: the observation has shape \(3,\); expected \(4,\), or \(N, 4\) for a batch of N$"),
        (np.zeros(8), r"has shape \(8,\); expected \(4,\)"),  # not two observations of 4
        (np.zeros((2, 2, 4)), r"has shape \(2, 2, 4\); expected \(4,\), or \(N, 4\)"),
    ],
)
def test_load_policy_names_the_expected_shape_of_a_wrong_observation(obs, message):
    policy = _loaded(gym.spaces.Box(-1.0, 1.0, (4,), np.float32))
    assert policy.act(np.zeros(4)) in range(3) and policy.act(np.zeros((5, 4))).shape == (5,)
    with pytest.raises(ValueError, match=message):
        policy.act(obs)


@pytest.mark.parametrize(
    "obs,message",
    [
        (
            {"position": np.zeros(3), "goal": 1},
            r"^act: the observation's 'position' has shape \(3,\); expected \(2,\), or \(N, 2\) for a batch of N$",
        ),
        ({"position": np.zeros(2)}, r"^act: the observation has no 'goal' \(the policy reads 'goal', 'position'\)$"),
        (
            {"position": np.zeros((3, 2)), "goal": np.zeros(2, int)},
            r"^act: the observation's 'goal' is a batch of 2 and its 'position' a batch of 3$",
        ),
        (
            {"position": np.zeros((3, 2)), "goal": 1},
            r"^act: the observation's 'goal' is one observation and its 'position' a batch of 3$",
        ),
    ],
)
def test_load_policy_names_the_part_of_a_dict_observation_at_fault(obs, message):
    policy = _loaded(goal_grid().observation_space)
    with pytest.raises(ValueError, match=message):
        policy.act(obs)


def test_load_policy_names_the_agent_whose_observation_has_a_wrong_shape():
    policy = _loaded(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), agents=["a", "b"])
    assert set(policy.act({"a": np.zeros(4), "b": np.zeros(4)})) == {"a", "b"}
    with pytest.raises(ValueError, match=r"^act: agent 'b': the observation has shape \(5,\); expected \(4,\)$"):
        policy.act({"a": np.zeros(4), "b": np.zeros(5)})


def test_load_policy_refuses_what_is_not_a_policy(tmp_path):
    with pytest.raises(ConfigError, match="no such run directory or checkpoint"):
        srl.load_policy(tmp_path / "missing")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"bad\.pt: not a torch file"):
        srl.load_policy(bad)


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "algorithm=ppo2",
            "algorithm: 'ppo2' is neither a built-in name (alphazero, dqn, lm_ppo, muzero, ppo, qmix, r2d2, sac, td3) nor 'package.module:attr'",
        ),
        ("algorithm=no_such_pkg.mod:Algo", "algorithm: cannot import module 'no_such_pkg.mod'"),
        ("model.encoder=examples.custom_network:Missing", "model.encoder: 'examples.custom_network' has no attribute"),
        ("stage.worker=examples.fresh_segments", "stage.worker: 'examples.fresh_segments' is neither a built-in"),
        ("env.id=__main__:MyEnv", "env.id: '__main__:MyEnv' is not in this program's __main__; what a script defines"),
    ],
)
def test_a_bad_plugin_name_is_one_line_and_exit_2(override, message):
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "train", "configs/cartpole_ppo.yaml", "--set", override, "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr, proc.stderr
