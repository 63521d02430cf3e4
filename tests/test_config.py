"""Config parsing: types, ranges, unknown keys, overrides; every error names its field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from srl.api.config import ConfigError, ExperimentConfig, load_config, notices, to_dict
from srl.api.config.errors import did_you_mean
from srl.api.config.load import overlay_overrides

CARTPOLE = "configs/cartpole_ppo.yaml"


def test_shipped_config_loads_and_round_trips(tmp_path):
    cfg = load_config(CARTPOLE)
    assert cfg.env.id == "CartPole-v1" and cfg.run.target_return == 475
    import yaml

    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(path) == cfg


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(str(p) for p in Path("configs").glob("*.yaml")))
def test_every_shipped_config_loads_round_trips_and_builds_its_env(tmp_path, path):
    """What the README promises for each file in configs/: it loads, saves back unchanged, and its env exists
    with its options (make_plan probes one slot)."""
    import yaml

    from srl.api.spaces import obs_parts
    from srl.runtime.plan import make_plan

    cfg = load_config(path)
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(again) == cfg
    if cfg.algorithm == "lm_ppo":  # its models are made on first use: here a few steps of each, in tmp_path
        from srl.text.pretrain import ensure_base
        from srl.text.reward_model import ensure_reward_model

        model, rm = tmp_path / "model", tmp_path / "rm"
        overrides = [f"text.model={model}", f"env.kwargs.tokenizer={model}", "text.base.steps=3"]
        if cfg.text.reward_model.folder is not None:
            overrides += [f"text.reward_model.folder={rm}", f"env.kwargs.reward_args.folder={rm}"]
        cfg = load_config(path, overrides)
        assert ensure_base(cfg)
        if cfg.text.reward_model.folder is not None:  # an untrained one (training it is tested in test_text.py)
            from srl.text.hf import load_lm, load_tokenizer
            from srl.text.reward_model import RewardModel, save_reward_model

            lm = load_lm(model)
            save_reward_model(RewardModel(lm.base_model, lm.config.hidden_size), load_tokenizer(model), rm, {})
    for policy in make_plan(cfg).policies:
        parts = obs_parts(policy.obs_space)
        assert policy.param_size > 0 and policy.layout.obs_fields == tuple(p.name for p in parts)
        assert all(policy.layout.fields[p.name].shape[2:] == p.shape for p in parts)


def test_overrides_are_type_checked_and_applied():
    cfg = load_config(
        CARTPOLE,
        [
            "ppo.lr=0.01",
            "model.hidden=[32, 16]",
            "runtime=inline",
            "ppo.value_clip=null",
            "ppo.value_clip=0.2",
            "run.max_wall_seconds=5",
        ],
    )
    assert cfg.ppo.lr == 0.01 and cfg.model.hidden == (32, 16) and cfg.runtime == "inline"
    assert cfg.ppo.value_clip == 0.2 and cfg.run.max_wall_seconds == 5.0
    assert isinstance(cfg.run.max_wall_seconds, float)


def test_exponent_notation_is_a_number():
    """PyYAML reads ``1e-4`` (no dot) as a string; a float field takes it as the number it means."""
    cfg = load_config(CARTPOLE, ["ppo.lr=1e-4", "ppo.adam_eps=2E-6"])
    assert cfg.ppo.lr == 1e-4 and cfg.ppo.adam_eps == 2e-6
    with pytest.raises(ConfigError, match="workers.actors: expected an integer"):
        load_config(CARTPOLE, ["workers.actors=1e2"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("ppo.lr=abc", "ppo.lr: expected a number"),
        ("ppo.lr=-1", "ppo.lr: must be > 0"),
        ("ppo.lrr=1", "ppo.lrr: unknown field"),
        ("workers.actors=0", "workers.actors: must be >= 1"),
        ("workers.actors=1.5", "workers.actors: expected an integer"),
        ("runtime=cluster", "runtime: must be one of inline, local"),
        ("model.hidden=[64, -1]", "model.hidden: must be a non-empty list"),
        ("model.layer_norm=maybe", "model.layer_norm: expected true/false"),
        ("ppo.gamma=1.5", "ppo.gamma: must be in [0, 1]"),
        ("ppo=3", "ppo: expected a mapping"),
        ("noequals", "expected key=value"),
        ('agents=[{"match": "a"}]', "agents[0].policy: missing (it has no default)"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(CARTPOLE, [override])
    assert message in str(info.value)


def test_bad_files_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo: [unclosed\n")
    with pytest.raises(ConfigError, match=re.escape("bad.yaml: line 2, column 1: invalid YAML: expected ',' or ']'")):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load_config(bad)


@pytest.mark.parametrize(
    "text, where", [("name: x\nenv:\n\tid: CartPole-v1\n", "line 3, column 1"), ("seed:\t1\n", "line 1, column 6")]
)
def test_a_tab_in_yaml_is_named_with_its_line_and_column(tmp_path, text, where):
    bad = tmp_path / "tabs.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(info.value) == f"{bad}: {where}: a tab character; YAML indents with spaces"


def test_a_tab_in_an_overlay_is_named_too(tmp_path):
    bad = tmp_path / "overlay.yaml"
    bad.write_text("ppo:\n\tlr: 0.1\n")
    with pytest.raises(ConfigError) as info:
        overlay_overrides(bad)
    assert str(info.value) == f"{bad}: line 2, column 1: a tab character; YAML indents with spaces"


def test_configs_are_frozen():
    cfg = ExperimentConfig()
    with pytest.raises(AttributeError):
        cfg.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--set", "ppo.clip=0"], "ppo.clip: must be > 0"),
        (["--set", "env.id=NoSuchEnv-v9"], "env.id: unknown environment 'NoSuchEnv-v9'"),
        (["--set", "env.id=CartPol-v1"], "env.id: unknown environment 'CartPol-v1'; did you mean 'CartPole-v1'?"),
        (["--set", "env.id=no_such_module:make"], "env.id: cannot import module 'no_such_module'"),
        (["--set", "workers.trainer_device=cuda:99"], "workers.trainer_device: cuda:99: torch sees"),
        (["--set", "workers.policy_workers=1", "--set", "workers.policy_device=cuda:99"], "policy_device: cuda:99"),
    ],
)
@pytest.mark.slow
def test_cli_prints_one_line_and_exits_non_zero(tmp_path, args, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "train", CARTPOLE, "--run-dir", str(tmp_path / "run"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srl: error: ") and needle in lines[0]
    assert not (tmp_path / "run").exists()  # nothing written for a run that never started


@pytest.mark.parametrize(
    "name, suggestion",
    [("CartPol-v1", "CartPole-v1"), ("cartpole-v1", "CartPole-v1"), ("CartPole-v9", "CartPole-v1"), ("Zzz", None)],
)
def test_a_mistyped_name_gets_the_closest_known_one(name, suggestion):
    said = did_you_mean(name, ["CartPole-v1", "CartPole-v0", "Pendulum-v1", "Acrobot-v1"])
    assert said == ("" if suggestion is None else f"; did you mean {suggestion!r}?")


@pytest.mark.parametrize("bad", ["override", "tab"])
def test_a_bad_config_is_refused_before_torch_or_gymnasium_is_imported(tmp_path, bad):
    """Bad input is answered in a fraction of a second: the config is checked before the heavy imports."""
    tabs = tmp_path / "tabs.yaml"
    tabs.write_text("env:\n\tid: CartPole-v1\n")
    argv = ["train", CARTPOLE, "--set", "ppo.lr=-1"] if bad == "override" else ["train", str(tabs)]
    code = (
        "import sys\n"
        "from srl.cli.main import main\n"
        f"rc = main({argv!r})\n"
        "print(rc, [m for m in ('torch', 'gymnasium') if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split("\n")[0] == "2 []", proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("srl: error: ")


@pytest.mark.slow
def test_instance_of_asks_without_importing():
    """Which kind of env a factory returned is asked without importing the backends the run does not use."""
    code = (
        "import sys, gymnasium as gym\n"
        "from srl.envs.multiagent import is_parallel_env\n"
        "from srl.envs.turns import is_aec_env, is_openspiel_game\n"
        "from srl.envs.vmas_slot import is_vmas_env\n"
        "env = gym.make('CartPole-v1')\n"
        "assert not (is_parallel_env(env) or is_aec_env(env) or is_openspiel_game(env) or is_vmas_env(env))\n"
        "print(sorted(m for m in ('pyspiel', 'pettingzoo', 'vmas') if m in sys.modules))\n"
        "import pyspiel\n"
        "from mpe2 import simple_spread_v3\n"
        "print(is_openspiel_game(pyspiel.load_game('tic_tac_toe')), is_parallel_env(simple_spread_v3.parallel_env()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True True"]


def test_a_target_written_for_the_file_s_env_is_dropped_when_an_override_changes_the_env():
    """``pendulum_sac.yaml``'s -250 would call MountainCarContinuous solved at a return of 0 (a policy that does
    nothing), and ``cartpole_dqn.yaml``'s 475 could never stop Acrobot: the target goes, said as a notice."""
    with notices() as said:
        moved = load_config("configs/pendulum_sac.yaml", ["env.id=MountainCarContinuous-v0"])
    assert moved.run.target_return is None
    assert said == [
        "run.target_return: dropped: -250 was set for Pendulum-v1, and env.id is now MountainCarContinuous-v0; "
        "set run.target_return too to stop at a return"
    ]
    with notices() as said:
        kept = load_config("configs/cartpole_dqn.yaml", ["env.id=Acrobot-v1", "run.target_return=-100"])
        same = load_config("configs/cartpole_dqn.yaml", ["env.id=CartPole-v1"])
    assert kept.run.target_return == -100 and same.run.target_return == 475 and said == []


def test_settings_of_an_algorithm_the_run_does_not_use_are_named_as_the_run_starts(tmp_path):
    from srl.runtime.train import train
    from srl.wiring import unread_sections

    td3 = load_config("configs/pendulum_sac.yaml", ["algorithm=td3"])
    assert unread_sections(td3) == [
        "sac: not read by algorithm td3 (it reads td3); ignored: sac.actor_lr, sac.batch_size, sac.tau"
    ]
    cfg = load_config(CARTPOLE, ["runtime=inline", "run.total_env_steps=256", "run.eval_episodes=0", "dqn.lr=0.01"])
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["warnings"] == ["dqn: not read by algorithm ppo (it reads ppo); ignored: dqn.lr"]
    assert all(unread_sections(load_config(path)) == [] for path in sorted(Path("configs").glob("*.yaml")))
