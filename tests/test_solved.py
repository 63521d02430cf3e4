"""When a run counts as solved: a target met before a full return window, or by the untrained policy, does not."""

from __future__ import annotations

import io
import time

import numpy as np

from conftest import reporting

from srl.api.config import load_config
from srl.runtime.train import train
from srl.system.controller import Controller
from srl.system.run_dir import Resume

CARTPOLE = "configs/cartpole_ppo.yaml"


def _episodes(controller: Controller, *returns: float) -> None:
    controller.handle("actor", {"worker": "actor0", "env_steps": 64}, {"episode_returns": np.array(returns)})


def test_a_target_counts_after_a_full_window_and_the_first_update_and_an_earlier_one_is_one_warning() -> None:
    cfg = load_config(CARTPOLE, ["run.target_return=0", "run.return_window=3"])
    progress = io.StringIO()
    controller = reporting(Controller(cfg, None, time.time(), progress=progress))
    _episodes(controller, 10.0, 10.0)  # two of three episodes
    _episodes(controller, 10.0)  # a full window, but of the untrained policy
    assert controller.should_stop() is None and controller.tally.solved_at is None
    assert len(controller.warnings) == 1 and progress.getvalue().count("warning:") == 1
    assert "run.target_return 0 met by the untrained policy" in controller.warnings[0]
    controller.handle("trainer", {"worker": "trainer0", "trainer": 0, "version": 1}, {})
    _episodes(controller, 10.0)
    assert controller.should_stop() == "solved" and len(controller.warnings) == 1
    trained = Resume(checkpoints=(), versions=(4,), env_steps=512, counters=None)  # its policy was trained
    resumed = reporting(Controller(cfg, None, time.time(), progress=None, resume=trained))
    assert resumed.record()["policy_version"] == 4  # before its trainer reports
    _episodes(resumed, 10.0, 10.0)
    assert resumed.tally.solved_at is None and "after 2 of run.return_window=3 episodes" in resumed.warnings[0]
    _episodes(resumed, 10.0)
    assert resumed.should_stop() == "solved"


def test_a_target_the_untrained_policy_meets_does_not_stop_the_run_before_the_first_update(tmp_path) -> None:
    """Every CartPole episode returns more than 0; an update takes 2048 env steps, and 20 episodes of the untrained
    policy end well before that."""
    sets = ["runtime=inline", "run.target_return=0", "run.eval_episodes=0", "workers.batch_segments=8"]
    progress = io.StringIO()
    summary = train(load_config(CARTPOLE, [*sets, "run.total_env_steps=20000"]), tmp_path / "run", progress=progress)
    assert summary["stop_reason"] == "solved" and summary["solved_env_steps"] >= 2048, summary
    early = [w for w in summary["warnings"] if "met by the untrained policy" in w]
    assert len(early) == 1 and progress.getvalue().count(early[0]) == 1, summary["warnings"]


def test_a_population_is_solved_when_its_best_member_is() -> None:
    """Members' episodes are no one policy's: the target is held against the best member's full window, not the
    mean of every member's episodes together."""
    cfg = load_config(CARTPOLE, ["run.target_return=100", "run.return_window=3", "population.members=2"])
    controller = reporting(Controller(cfg, None, time.time(), progress=None))
    for trainer in (0, 1):  # each member's trainer has updated
        controller.handle("trainer", {"worker": f"trainer{trainer}", "trainer": trainer, "version": 1}, {})

    def episodes(member: int, *returns: float) -> None:
        owners = np.full(len(returns), member, np.int32)
        controller.handle(
            "actor",
            {"worker": "actor0", "env_steps": 64},
            {"episode_returns": np.array(returns), "episode_policies": owners},
        )

    episodes(1, 10.0, 10.0, 10.0)
    episodes(0, 150.0, 150.0)  # member 0's window is not full yet; the run's mean is 66
    assert controller.tally.solved_at is None
    episodes(0, 150.0)  # now it is: 150, though the run's last 3 episodes are too
    episodes(1, 10.0, 10.0, 10.0)  # the run's window: member 1's 10s
    assert controller.should_stop() == "solved" and controller.tally.solved_return_mean == 150.0
    assert controller.tally.return_mean == 10.0


def test_a_run_is_solved_at_the_env_steps_of_the_report_whose_episodes_met_the_target() -> None:
    cfg = load_config(CARTPOLE, ["run.target_return=10", "run.return_window=2"])
    controller = reporting(Controller(cfg, None, time.time(), progress=None))
    controller.handle("trainer", {"worker": "trainer0", "trainer": 0, "version": 1}, {})
    controller.handle("actor", {"worker": "actor0", "env_steps": 256}, {"episode_returns": np.array([5.0])})
    controller.handle("actor", {"worker": "actor0", "env_steps": 512}, {"episode_returns": np.array([20.0])})
    assert controller.should_stop() == "solved" and controller.tally.solved_env_steps == 512
