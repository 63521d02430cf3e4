"""What an algorithm declares to the runtime: typed settings (its section, or ``algorithm_args``), on_policy, and the
``check(plan)`` / ``prepare(cfg)`` hooks, each asked for by the runtime instead of knowing the algorithm by name."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from gymnasium import spaces

from srl.algorithms.ppo import PPO
from srl.api.config import ConfigError, config_from
from srl.api.config.errors import check
from srl.runtime.plan import make_plan
from srl.runtime.train import train
from srl.wiring import algorithm_settings, discount, learns_on_policy, make_algorithm, prepare_algorithm

ROOT = Path(__file__).resolve().parents[1]
OBS, ACT = spaces.Box(-1.0, 1.0, (4,)), spaces.Discrete(2)
HERE = "test_algorithm_api"
"""This module, as a plugin's ``module:attr`` names it (pytest puts tests/ on the path)."""


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """A plugin's settings."""

    lr: float = 0.1
    """A positive number."""
    layers: tuple[int, ...] = (4,)
    """A list in the YAML."""

    def __post_init__(self) -> None:
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")


class Probe:
    """A plugin algorithm with typed settings: it keeps what it is handed."""

    settings: ClassVar[type] = ProbeSettings
    on_policy: ClassVar[bool] = False

    def __init__(self, ctx: Any) -> None:
        self.args = ctx.args


@dataclass(frozen=True, kw_only=True)
class Needed:
    """Settings with a field that has no default."""

    size: int
    """Must be given."""


class NeedsSize(Probe):
    settings: ClassVar[type] = Needed


class Hooked(PPO):
    """PPO that records when the runtime calls its hooks, and with what."""

    calls: ClassVar[list[tuple[str, Any]]] = []

    @classmethod
    def prepare(cls, cfg: Any) -> None:
        cls.calls.append(("prepare", cfg.algorithm))

    @classmethod
    def check(cls, plan: Any) -> None:
        cls.calls.append(("check", tuple(p.action_space for p in plan.policies)))


def _cfg(algorithm: str, **sections: Any) -> Any:
    return config_from({"algorithm": algorithm, "env": {"id": "CartPole-v1"}, **sections})


def _refusal(cfg: Any) -> str:
    """The one line a run of ``cfg`` is refused with before its plan is made."""
    with pytest.raises(ConfigError) as refused:
        prepare_algorithm(cfg)
    return str(refused.value)


def test_a_plugin_is_handed_its_settings_typed_and_checked_where_it_declares_them():
    algo = make_algorithm(OBS, ACT, _cfg(f"{HERE}:Probe", algorithm_args={"lr": 0.5, "layers": [8, 8]}), seed=0)
    assert algo.args == ProbeSettings(lr=0.5, layers=(8, 8))
    assert algorithm_settings(_cfg(f"{HERE}:Probe")) == ProbeSettings()  # none given: the defaults
    assert not learns_on_policy(_cfg(f"{HERE}:Probe")) and learns_on_policy(_cfg("ppo"))
    refusals = {
        "nope": (1, "algorithm_args.nope: unknown field (known: layers, lr)"),
        "lr": ("fast", "algorithm_args.lr: expected a number, got 'fast'"),
        "layers": ([1, "x"], "algorithm_args.layers[1]: expected an integer, got 'x'"),
    }
    for key, (value, message) in refusals.items():
        assert _refusal(_cfg(f"{HERE}:Probe", algorithm_args={key: value})) == message
    assert _refusal(_cfg(f"{HERE}:Probe", algorithm_args={"lr": -1})) == "algorithm_args.lr: must be > 0, got -1.0"
    assert _refusal(_cfg(f"{HERE}:NeedsSize")) == "algorithm_args.size: missing (it has no default)"


def test_a_built_in_reads_its_section_with_the_policy_s_overrides():
    cfg = _cfg(
        "ppo",
        ppo={"lr": 0.002, "gamma": 0.9},
        agents=[{"match": "x", "policy": "a"}, {"match": ".*", "policy": "b"}],
        policies=[{"name": "b", "ppo": {"lr": 0.01}}],
    )
    assert algorithm_settings(cfg.for_policy("a")) is cfg.ppo
    assert algorithm_settings(cfg.for_policy("b")).lr == 0.01
    algo = make_algorithm(OBS, ACT, _cfg("ppo", ppo={"normalize_values": True}), seed=0)
    assert algo.value.return_normalizer is not None  # the critic is built from PPO's own setting
    assert make_algorithm(OBS, ACT, _cfg("ppo"), seed=0).value.return_normalizer is None
    assert _refusal(_cfg("ppo", algorithm_args={"lr": 0.1})) == (
        "algorithm_args: 'ppo' takes its settings from the ppo section, not from algorithm_args"
    )


def test_a_plugin_without_settings_takes_no_algorithm_args():
    probe = "srl.system.testing:MemoryProbe"
    assert algorithm_settings(_cfg(probe)) is None
    assert _refusal(_cfg(probe, algorithm_args={"lr": 0.1})) == (
        f"algorithm_args: {probe!r} declares no settings, so it takes none"
    )


def test_the_discount_is_the_algorithm_s():
    """The actors' reward scaling follows the algorithm's own ``gamma``, 0.99 when its settings have none."""
    assert discount(_cfg("ppo", ppo={"gamma": 0.9})) == 0.9
    assert discount(_cfg("examples.a2c:A2C", algorithm_args={"gamma": 0.8})) == 0.8
    assert discount(_cfg(f"{HERE}:Probe")) == 0.99


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "plan"])
def test_srl_refuses_bad_algorithm_args_in_one_line_before_any_worker_starts(tmp_path, command):
    where = ["--run-dir", str(tmp_path / "run")] if command == "train" else ["--nodes", "1", "--cores-per-node", "2"]
    config = "examples/a2c.yaml" if command == "train" else "--config=examples/a2c.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", command, config, "--set", "algorithm_args.lr=fast", *where],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "srl: error: algorithm_args.lr: expected a number, got 'fast'"
    assert not (tmp_path / "run").exists()


def test_the_runtime_prepares_then_checks_the_plan_through_the_algorithm_s_hooks(tmp_path):
    Hooked.calls.clear()
    run = {"total_env_steps": 512, "eval_episodes": 0}
    cfg = _cfg(f"{HERE}:Hooked", runtime="inline", workers={"actors": 1, "policy_workers": 0}, run=run)
    train(cfg, tmp_path / "run", progress=None)
    assert Hooked.calls == [("prepare", f"{HERE}:Hooked"), ("check", (ACT,))]


def test_ppo_checks_its_minibatches_against_the_probed_env():
    few = _cfg("ppo", workers={"batch_segments": 1, "envs_per_slot": 2, "segment_length": 4}, ppo={"minibatches": 9})
    with pytest.raises(ConfigError) as refused:
        make_plan(few)
    assert str(refused.value) == (
        "ppo.minibatches: 9 minibatches of an update of 8 samples: lower it, or raise workers.batch_segments or "
        "workers.envs_per_slot"
    )
