"""Multi-agent envs as slots: PettingZoo parallel envs, every agent a column, and a cooperative task that learns."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import srl
from srl.api.config import ConfigError, EnvConfig
from srl.envs.slots import make_slot, probe_spaces

COOP = "srl.envs.ma_testing:coop_targets"
SPREAD = EnvConfig(
    id="mpe2.simple_spread_v3:parallel_env", kwargs={"N": 3, "max_cycles": 25, "continuous_actions": False}
)


def _train_cli(*sets: str) -> subprocess.CompletedProcess:
    """``srl train configs/cartpole_ppo.yaml --set ...`` in a child process, quiet."""
    cmd = [sys.executable, "-m", "srl.cli.main", "train", "configs/cartpole_ppo.yaml", "--quiet"]
    for kv in sets:
        cmd += ["--set", kv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _target(obs: np.ndarray, n: int = 4) -> np.ndarray:
    return obs[:, :n].argmax(1)


def test_every_agent_of_every_env_is_a_column_in_agent_order():
    slot = make_slot(EnvConfig(id=COOP, kwargs={"agents": 3}), 2)
    try:
        assert (slot.num_envs, slot.agents_per_env) == (6, 3)
        obs = slot.reset(seed=5)["obs"]
        assert obs.shape == (6, 7)
        # column e * 3 + i is agent i of env e: its own index is one-hot after the target
        assert (obs[:, 4:].argmax(1) == np.tile(np.arange(3), 2)).all()
        # agents 0 and 2 of env 0 and agent 1 of env 1 pick their targets: each env's team reward is its share
        actions = (_target(obs) + 1) % 4
        actions[[0, 2, 4]] = _target(obs)[[0, 2, 4]]
        step = slot.step(actions)
        assert step.reward.tolist() == pytest.approx([2 / 3] * 3 + [1 / 3] * 3)
        assert not step.episode_end.any() and step.final_obs is None
    finally:
        slot.close()


def test_episodes_end_for_all_agents_together_with_their_final_observations():
    slot = make_slot(EnvConfig(id=COOP, kwargs={"length": 3}), 2)
    try:
        slot.reset(seed=0)
        for _ in range(2):
            assert not slot.step(np.zeros(4, np.int64)).episode_end.any()
        last = slot.step(np.zeros(4, np.int64))
        assert last.truncated.all() and not last.terminated.any() and last.episode_end.all()
        assert last.final_obs is not None and last.final_obs["obs"].shape == (4, 6)
        assert not slot.step(np.zeros(4, np.int64)).episode_end.any()  # the envs were reset within the step
    finally:
        slot.close()


def test_mpe_simple_spread_is_three_columns_per_env():
    probed = probe_spaces(SPREAD)
    assert (probed.obs.shape, probed.action.n, probed.agents, probed.state.shape) == ((18,), 5, 3, (54,))
    slot = make_slot(SPREAD, 4)
    try:
        slot.reset(seed=0)
        ends = 0
        for _ in range(50):
            step = slot.step(np.random.default_rng(0).integers(0, 5, 12))
            ends += int(step.episode_end.sum())
        assert ends == 2 * 12  # 25-step episodes, every agent of every env
    finally:
        slot.close()


@pytest.mark.parametrize(
    ("env", "obs", "actions", "length"),
    [("lbforaging:Foraging-8x8-2p-2f-coop-v3", (12,), 6, 50), ("rware:rware-tiny-2ag-v2", (71,), 5, 500)],
)
def test_gymnasium_envs_of_several_agents_are_one_column_per_agent(env, obs, actions, length):
    """LBF and RWARE (Tuple spaces, one reward per agent) through srl.envs.gym_agents: two columns per env, each
    agent's own observation and reward, and every agent's episode ending with the env's, at its time limit at the
    latest. The global state is both agents' observations joined."""
    from srl.envs.gym_agents import parallel

    cfg = EnvConfig(id="srl.envs.gym_agents:parallel", kwargs={"env": env})
    probed = probe_spaces(cfg)
    assert (probed.obs.shape, probed.action.n, probed.agents, probed.state.shape) == (obs, actions, 2, (2 * obs[0],))
    one = parallel(env)
    try:
        seen, _ = one.reset(seed=1)
        for _ in range(3):
            np.testing.assert_array_equal(one.state(), np.concatenate([seen["agent_0"], seen["agent_1"]]))
            assert one.state() in one.state_space
            seen = one.step({"agent_0": 1, "agent_1": 2})[0]
    finally:
        one.close()
    slot = make_slot(cfg, 3)
    rng = np.random.default_rng(0)
    try:
        slot.reset(seed=0)
        ends, steps = np.zeros(6, int), 0
        while ends.min() == 0:
            step = slot.step(rng.integers(0, actions, 6))
            steps += 1
            assert step.obs["obs"].shape == (6, *obs) and step.reward.shape == (6,)
            assert (step.episode_end[0::2] == step.episode_end[1::2]).all()  # both agents of an env end together
            ends += step.episode_end
        assert steps <= length
    finally:
        slot.close()
    with pytest.raises(ConfigError, match=r"^env\.kwargs\.env: 'CartPole-v1' is not an env of several agents"):
        probe_spaces(EnvConfig(id="srl.envs.gym_agents:parallel", kwargs={"env": "CartPole-v1"}))
    with pytest.raises(ConfigError, match=r"^env\.kwargs\.env: 'lbforaging:NoSuchEnv-v0' cannot be made"):
        probe_spaces(EnvConfig(id="srl.envs.gym_agents:parallel", kwargs={"env": "lbforaging:NoSuchEnv-v0"}))


def test_bench_sampling_refuses_a_multi_agent_env_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "bench", "sampling", "--config", "configs/mpe_simple_spread_ippo.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "is a multi-agent env, and the baseline it compares with is a single-agent" in proc.stderr


def test_agents_with_other_spaces_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"agent 'agent_1' has other spaces than 'agent_0'"):
        probe_spaces(EnvConfig(id=COOP, kwargs={"odd_spaces": True}))


def test_an_env_whose_agent_spaces_change_mid_run_fails_in_one_line_naming_the_agent():
    proc = _train_cli(f"env.id={COOP}", "env.kwargs={grow_at: 5}", "runtime=inline")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and "agent 'agent_1': observation 'obs' of shape (7,), but its space has (6,)" in line


def test_an_agent_done_before_the_others_leaves_its_column_idle_until_the_env_ends():
    """agent_0 terminates after 4 of 8 steps: its column is not alive (zero reward, no episode end) until the env
    resets with both agents."""
    slot = make_slot(EnvConfig(id=COOP, kwargs={"finish_early": True}), 1)
    try:
        slot.reset(seed=0)
        steps = [slot.step(np.zeros(2, np.int64)) for _ in range(9)]
        assert [s.alive.tolist() for s in steps] == [[True, True]] * 4 + [[False, True]] * 4 + [[True, True]]
        assert [s.episode_end.tolist() for s in steps[:8]] == [[False, False]] * 3 + [[True, False]] + [
            [False, False]
        ] * 3 + [[False, True]]
        assert steps[3].terminated[0] and steps[7].truncated[1] and not steps[7].truncated[0]
        assert all(s.reward[0] == 0 and (s.obs["obs"][0] == 0).all() for s in steps[4:7])  # idle, not acting
        assert (steps[7].obs["obs"] != 0).any(axis=1).all()  # the env reset: both agents observe again
    finally:
        slot.close()


@pytest.mark.slow
def test_agents_that_finish_apart_still_learn(tmp_path):
    """Only the steps an agent acted in are samples (the ``alive`` field); agent_0 plays 4 steps, agent_1 8, so
    a perfect team's mean return is 6 and a random one's 1.5."""
    summary = srl.train(
        {
            "env": {"id": COOP, "kwargs": {"finish_early": True}},
            "run": {"total_env_steps": 400_000, "target_return": 5.0, "return_window": 100},
        },
        run_dir=tmp_path / "run",
    )
    assert summary["solved"] and summary["solved_return_mean"] >= 5.0, summary


@pytest.mark.parametrize("runtime", ["inline", "local"])
def test_a_two_agent_cooperative_env_learns_with_default_settings(runtime, tmp_path):
    """Random play scores 2 of 8; the threshold needs both agents to pick their own targets most of the time."""
    summary = srl.train(
        {
            "runtime": runtime,
            "env": {"id": COOP},
            "run": {"total_env_steps": 400_000, "target_return": 6.5, "return_window": 100},
        },
        run_dir=tmp_path / "run",
    )
    assert summary["solved"] and summary["solved_return_mean"] >= 6.5, summary
    assert summary["final_eval_agents_per_episode"] == 2


# ---------------------------------------------------------------------------------------------- action masks
def test_masked_logits_never_sample_an_illegal_action_and_renormalize():
    import torch

    from srl.nets.distributions import categorical_act, mask_logits, masked_categorical_evaluate

    logits = torch.randn(4000, 5)
    legal = torch.tensor([[1, 0, 1, 0, 0]] * 2000 + [[0, 0, 0, 0, 1]] * 1999 + [[0, 0, 0, 0, 0]], dtype=torch.int8)
    masked = mask_logits(logits, legal)
    actions, logp = categorical_act(masked, deterministic=False)
    assert set(actions[:2000].tolist()) <= {0, 2} and (actions[2000:3999] == 4).all()
    assert (logp[2000:3999] == 0).all()  # the only legal action has probability 1
    # the first rows: p renormalized over actions 0 and 2 only
    p0 = torch.softmax(logits[0, [0, 2]], 0)
    lp, ent = masked_categorical_evaluate(masked[:1], torch.tensor([2]))
    assert lp.item() == pytest.approx(p0[1].log().item(), abs=1e-6)
    assert ent.item() == pytest.approx(-(p0 * p0.log()).sum().item(), abs=1e-6)
    assert torch.isfinite(masked[3999]).all()  # no legal action at all: left unmasked, never NaN
    masked.requires_grad_(True)
    lp, ent = masked_categorical_evaluate(mask_logits(logits.requires_grad_(True), legal), actions)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_an_action_mask_part_is_not_encoded_and_must_fit_the_actions():
    import gymnasium as gym

    from srl.nets.policy import ObsEncoder, PolicyNet

    space = gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (6,)), "action_mask": gym.spaces.MultiBinary(6)})
    assert [p.name for p in ObsEncoder(space, (8,), "tanh", False, True).parts] == ["obs.observation"]
    assert PolicyNet(space, gym.spaces.Discrete(6)).mask == "obs.action_mask"
    with pytest.raises(ValueError, match="expected 5 0/1 entries"):
        PolicyNet(space, gym.spaces.Discrete(5))
    with pytest.raises(ValueError, match="apply to Discrete actions"):
        PolicyNet(space, gym.spaces.MultiDiscrete([2, 3]))


def test_a_mask_that_does_not_fit_the_actions_is_one_line():
    proc = _train_cli("env.id=srl.envs.testing:masked_choice", "env.kwargs={mask_size: 4}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "expected 6 0/1 entries (one per action)" in proc.stderr


@pytest.mark.parametrize("overrides", [["runtime=inline"], ["workers.policy_workers=1", "workers.actors=2"]])
def test_a_masked_env_learns_and_never_gets_an_illegal_action(overrides, tmp_path):
    """MaskedChoice raises on an illegal action, so the run itself is the check (inference in the actor and in
    a policy worker); picking among legal actions at random scores 8/3, the threshold needs the target."""
    summary = srl.train(
        {
            "env": {"id": "srl.envs.testing:masked_choice"},
            "run": {"total_env_steps": 300_000, "target_return": 7.0, "return_window": 100},
        },
        overrides,
        run_dir=tmp_path / "run",
    )
    assert "error" not in summary, summary["error"]
    assert summary["solved"], summary


# ---------------------------------------------------------------------------------------------- MAPPO's global state
def test_the_global_state_rides_with_every_agent_and_is_never_acted_on():
    from srl.api.config import load_config
    from srl.runtime.plan import make_plan

    slot = make_slot(EnvConfig(id=COOP, kwargs={"agents": 3}), 2, state=True)
    try:
        obs = slot.reset(seed=1)
        assert obs["state"].shape == (6, 12)
        assert (obs["state"][:3] == obs["state"][0]).all() and (obs["state"][3:] == obs["state"][3]).all()
        # the state is every agent's target: agent i's own target sits in block i
        targets = obs["state"][0].reshape(3, 4).argmax(1)
        assert (targets == _target(obs["obs"][:3])).all()
        step = slot.step(np.zeros(6, np.int64))
        assert step.obs["state"].shape == (6, 12)
    finally:
        slot.close()
    plan = make_plan(load_config("configs/mpe_simple_spread_mappo.yaml"))
    [policy] = plan.policies
    assert policy.state_space is not None and policy.state_space.shape == (54,)
    assert "state" in policy.layout.fields and "final_state" in policy.layout.fields
    assert policy.layout.obs_fields == ("obs",)  # inference never gathers the state
    ippo = make_plan(load_config("configs/mpe_simple_spread_ippo.yaml"))
    assert "state" not in ippo.policies[0].layout.fields  # carried only when the critic reads it


def test_a_critic_on_the_state_needs_an_env_with_one():
    with pytest.raises(ConfigError, match=r"ppo.critic_input: state: env 'CartPole-v1' has no global state"):
        srl.train({"env": {"id": "CartPole-v1"}, "ppo": {"critic_input": "state"}})
    with pytest.raises(ConfigError, match=r"needs model\.shared_encoder: false"):
        srl.train({"env": {"id": COOP}, "ppo": {"critic_input": "state"}, "model": {"shared_encoder": True}})


@pytest.mark.parametrize("overrides", [["runtime=inline"], ["workers.policy_workers=1", "workers.actors=2"]])
def test_mappo_with_a_critic_on_the_global_state_learns_the_cooperative_task(overrides, tmp_path):
    summary = srl.train(
        {
            "env": {"id": COOP},
            "ppo": {"critic_input": "state"},
            "run": {"total_env_steps": 400_000, "target_return": 6.5, "return_window": 100},
        },
        overrides,
        run_dir=tmp_path / "run",
    )
    assert summary["solved"] and summary["solved_return_mean"] >= 6.5, summary


@pytest.mark.slow
def test_the_agent_id_switch_lets_one_shared_policy_act_per_agent(tmp_path):
    """Every agent sees the same observation (both targets, no index). Knowing only that, a shared policy scores
    at most 5 of 8 (it can name one target per step: 3/4 of steps pay 1/2, the steps with equal targets 1);
    with ``env.agent_id`` it learns to pick its own."""
    probed = probe_spaces(EnvConfig(id=COOP, kwargs={"shared_obs": True}, agent_id=True))
    assert set(probed.obs.spaces) == {"observation", "agent"} and probed.obs["agent"].n == 2
    slot = make_slot(EnvConfig(id=COOP, kwargs={"shared_obs": True}, agent_id=True), 3)
    try:
        obs = slot.reset(seed=0)
        assert obs["obs.agent"].tolist() == [0, 1] * 3 and obs["obs.observation"].shape == (6, 8)
        assert (obs["obs.observation"][0::2] == obs["obs.observation"][1::2]).all()  # nothing else tells them apart
        shown = [obs["obs.observation"][0]] + [
            slot.step(np.zeros(6, np.int64)).obs["obs.observation"][0] for _ in range(39)
        ]
    finally:
        slot.close()
    base = {"runtime": "inline", "env": {"id": COOP, "kwargs": {"shared_obs": True}}}
    run = {"total_env_steps": 150_000, "target_return": 6.5, "return_window": 100}
    seated = srl.train({**base, "env": {**base["env"], "agent_id": True}, "run": run}, run_dir=tmp_path / "seated")
    assert seated["solved"], seated
    loaded = srl.load_policy(tmp_path / "seated")
    right = 0
    for x in shown:  # the seat is filled in by load_policy: each agent names its own target
        actions = loaded.act({"agent_0": x, "agent_1": x})
        right += sum(int(actions[f"agent_{i}"]) == int(x.reshape(2, 4)[i].argmax()) for i in range(2))
    assert right >= 0.8 * 2 * len(shown), right  # a blind policy averages 5/8 of them at best
    blind = srl.train({**base, "run": {**run, "total_env_steps": 60_000}}, run_dir=tmp_path / "blind")
    assert not blind["solved"] and blind["train_return_mean"] <= 5.4, blind


def test_load_policy_answers_a_dict_of_agent_observations(tmp_path):
    from srl.envs.ma_testing import coop_targets

    summary = srl.train(
        {"runtime": "inline", "env": {"id": COOP}, "run": {"total_env_steps": 200_000, "target_return": 7.0}},
        run_dir=tmp_path / "run",
    )
    assert summary["solved"], summary
    policy = srl.load_policy(tmp_path / "run")
    assert policy.agents == ["agent_0", "agent_1"]
    env = coop_targets()
    obs, _ = env.reset(seed=11)
    actions = policy.act(obs)
    assert set(actions) == {"agent_0", "agent_1"}
    assert all(env.action_space(a).contains(int(x)) for a, x in actions.items())
    # a policy that solved the task picks each agent's own target
    assert [int(actions[a]) for a in env.agents] == [int(obs[a][:4].argmax()) for a in env.agents]
    with pytest.raises(ValueError, match="dict of agent id -> observation"):
        policy.act(obs["agent_0"])


# ---------------------------------------------------------------------------------------------- VMAS
VMAS = EnvConfig(
    id="vmas:make_env",
    kwargs={"scenario": "balance", "n_agents": 3, "max_steps": 6, "continuous_actions": True, "device": "cpu"},
)


def test_a_vmas_env_is_one_batched_slot_of_worlds_times_agents():
    probed = probe_spaces(VMAS)
    assert (probed.obs.shape, probed.action.shape, probed.agents) == ((16,), (2,), 3)
    slot = make_slot(VMAS, 4)
    try:
        assert slot.env.num_envs == 4 and slot.num_envs == 12  # one VMAS env: num_envs worlds
        obs = slot.reset(seed=0)["obs"]
        assert obs.shape == (12, 16)
        for _ in range(5):
            step = slot.step(np.zeros((12, 2), np.float32))
            assert not step.episode_end.any()
            # one team reward per world, the same in its 3 columns
            assert (step.reward.reshape(4, 3) == step.reward.reshape(4, 3)[:, :1]).all()
        last = slot.step(np.full((12, 2), 5.0, np.float32))  # clipped to the bounds, not refused
        assert last.truncated.all() and not last.terminated.any()  # max_steps is a time limit
        assert last.final_obs is not None and last.final_obs["obs"].shape == (12, 16)
        assert not slot.step(np.zeros((12, 2), np.float32)).episode_end.any()  # every world was reset
    finally:
        slot.close()


@pytest.mark.slow
def test_a_vmas_run_trains_end_to_end(tmp_path):
    summary = srl.train(
        {
            "runtime": "inline",
            "env": {"id": VMAS.id, "kwargs": {**VMAS.kwargs, "max_steps": 50}},
            "workers": {"envs_per_slot": 8, "segment_length": 25},
            "run": {"total_env_steps": 4_000},
        },
        run_dir=tmp_path / "run",
    )
    assert summary["stop_reason"] == "env_steps" and summary["episodes"] > 0, summary
    assert summary["final_eval_agents_per_episode"] == 3


def test_a_multi_agent_run_resumes_counting_env_steps_not_agent_steps(tmp_path):
    from srl.api.config import load_config
    from srl.runtime.train import resume_config, train
    from srl.system.checkpoint import checkpoints, load_checkpoint

    run = tmp_path / "run"
    cfg = load_config("configs/mpe_simple_spread_ippo.yaml", ["runtime=inline", "run.total_env_steps=3000"])
    first = train(cfg, run, progress=None)
    ckpt = load_checkpoint(checkpoints(run / "checkpoints")[-1])
    per_update = 4 * 25 * 8  # batch_segments x segment_length x envs_per_slot env steps (x 3 agents = samples)
    assert ckpt["trained_samples"] == int(ckpt["version"]) * per_update
    cfg2, resume = resume_config(run, ["run.total_env_steps=6000"])
    second = train(cfg2, run, progress=None, resume=resume)
    assert first["env_steps"] >= 3000 and second["env_steps"] >= 6000
    assert second["env_steps"] < 6000 + 3 * per_update  # counted on from env steps, not from 3x as many samples
    assert second["policy_version"] > first["policy_version"]
