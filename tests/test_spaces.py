"""Observation parts and action specs for every supported Gymnasium space, the declared sample schema, and what
carries them: env construction, slots, the segment pool's inference reads and answers, and the observation encoder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from srl.api.config import ConfigError, EnvConfig
from srl.api.schema import Field, SampleSchema, Scope, env_fields, sample_schema
from srl.api.spaces import (
    ActionSpec,
    ObsPart,
    UnsupportedSpace,
    action_spec,
    check_fits,
    describe,
    flatten_obs,
    obs_parts,
)
from srl.base.channel import InProcChannel
from srl.envs.factory import ShiftActions, make_env
from srl.envs.slots import GymSlot, make_slot
from srl.envs.testing import GoalGrid, goal_grid
from srl.nets.policy import ObsEncoder, PolicyNet, ValueNet
from srl.system.streams import InferenceClient, InferenceServer, InlineInference, PoolLayout, SegmentPool, write_answer

# --- a tiny env over any space, reachable as an ``env.id`` of this module ---------------------------------------

SPACES: dict[str, Callable[[], spaces.Space]] = {
    "box": lambda: spaces.Box(-1.0, 1.0, (2,), np.float32),
    "discrete": lambda: spaces.Discrete(3),
    "discrete_start": lambda: spaces.Discrete(3, start=-1),
    "multi_discrete_start": lambda: spaces.MultiDiscrete([3, 4], start=[1, 2]),
    "text": lambda: spaces.Text(5),
    "graph": lambda: spaces.Graph(spaces.Box(0.0, 1.0, (2,), np.float32), spaces.Discrete(3)),
    "sequence": lambda: spaces.Sequence(spaces.Discrete(2)),
    "dict": lambda: spaces.Dict({"a": spaces.Discrete(2)}),
    "tuple": lambda: spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))),
    "nested_text": lambda: spaces.Dict({"pos": spaces.Box(0.0, 1.0, (2,), np.float32), "name": spaces.Text(4)}),
    "nested": lambda: spaces.Dict(
        {
            "v": spaces.Box(-1.0, 1.0, (3,), np.float32),
            "t": spaces.Tuple((spaces.Discrete(4, start=1), spaces.MultiBinary(3))),
            "m": spaces.MultiDiscrete([2, 3], start=[0, -1]),
        }
    ),
}

CREATED: list[SpaceEnv] = []


class SpaceEnv(gym.Env):
    """Random observations of ``SPACES[obs]``; records the actions it receives and whether it was closed."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, obs: str, action: str, max_steps: int | None) -> None:
        self.observation_space = SPACES[obs]()
        self.action_space = SPACES[action]()
        self.max_steps = max_steps
        self.received: list[Any] = []
        self.closed = False
        self._t = 0
        CREATED.append(self)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self._t = 0
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.received.append(action)
        self._t += 1
        truncated = self.max_steps is not None and self._t >= self.max_steps
        return self.observation_space.sample(), float(self._t), False, truncated, {}

    def close(self) -> None:
        self.closed = True


def space_env(obs: str = "box", action: str = "discrete", max_steps: int | None = None) -> SpaceEnv:
    return SpaceEnv(obs, action, max_steps)


ENV_ID = f"{__name__}:space_env"
GOAL_GRID = "srl.envs.testing:goal_grid"


# --- obs_parts ---------------------------------------------------------------------------------------------------


def test_plain_box_is_one_part_named_obs() -> None:
    (part,) = obs_parts(spaces.Box(-np.inf, np.inf, (4,), np.float32))
    assert part == ObsPart("obs", "vector", (4,), "float32")
    assert part.final_name == "final_obs"


def test_box_dtypes_on_the_stream() -> None:
    assert obs_parts(spaces.Box(-1.0, 1.0, (3, 2), np.float64)) == (ObsPart("obs", "vector", (3, 2), "float32"),)
    assert obs_parts(spaces.Box(0, 9, (2,), np.int32)) == (ObsPart("obs", "vector", (2,), "int32"),)
    # uint8 is an image only as [C, H, W]
    assert obs_parts(spaces.Box(0, 255, (4, 84, 84), np.uint8)) == (ObsPart("obs", "image", (4, 84, 84), "uint8"),)
    assert obs_parts(spaces.Box(0, 255, (84, 84), np.uint8))[0].kind == "vector"
    assert obs_parts(spaces.Box(0.0, 1.0, (3, 8, 8), np.float32))[0].kind == "vector"
    assert obs_parts(spaces.Box(0, 1, (2,), np.bool_)) == (ObsPart("obs", "vector", (2,), "int8"),)  # flags as 0/1


def test_discrete_multidiscrete_and_multibinary_parts() -> None:
    assert obs_parts(spaces.Discrete(5, start=-2)) == (ObsPart("obs", "discrete", (), "int64", (5,), (-2,)),)
    assert obs_parts(spaces.MultiDiscrete([2, 3, 4], start=[1, 0, -1])) == (
        ObsPart("obs", "multi_discrete", (3,), "int64", (2, 3, 4), (1, 0, -1)),
    )
    assert obs_parts(spaces.MultiDiscrete([2, 3])) == (ObsPart("obs", "multi_discrete", (2,), "int64", (2, 3), (0, 0)),)
    assert obs_parts(spaces.MultiBinary(4)) == (ObsPart("obs", "binary", (4,), "int8"),)
    assert obs_parts(spaces.MultiBinary([2, 3])) == (ObsPart("obs", "binary", (2, 3), "int8"),)
    with pytest.raises(UnsupportedSpace, match=r"nvec of shape \(2, 2\)"):
        obs_parts(spaces.MultiDiscrete([[2, 3], [4, 5]]))


def test_nested_dict_and_tuple_parts_are_depth_first_in_key_order() -> None:
    space = spaces.Dict(
        [
            ("a", spaces.Box(-1.0, 1.0, (3,), np.float64)),
            ("b", spaces.Tuple((spaces.Discrete(4, start=1), spaces.MultiBinary(2)))),
            (
                "c",
                spaces.Dict([("z", spaces.MultiDiscrete([2, 5])), ("img", spaces.Box(0, 255, (3, 36, 36), np.uint8))]),
            ),
        ]
    )
    parts = obs_parts(space)
    assert [p.name for p in parts] == ["obs.a", "obs.b.0", "obs.b.1", "obs.c.z", "obs.c.img"]
    assert [p.kind for p in parts] == ["vector", "discrete", "binary", "multi_discrete", "image"]
    assert [p.shape for p in parts] == [(3,), (), (2,), (2,), (3, 36, 36)]
    assert [p.dtype for p in parts] == ["float32", "int64", "int8", "int64", "uint8"]
    assert parts[1].nvec == (4,) and parts[1].start == (1,)
    assert parts[3].nvec == (2, 5) and parts[3].start == (0, 0)
    assert parts[3].final_name == "final_obs.c.z"
    # a Tuple at the top, a Dict inside it
    nested = obs_parts(spaces.Tuple((spaces.Dict([("x", spaces.Discrete(2))]), spaces.Discrete(3))))
    assert [p.name for p in nested] == ["obs.0.x", "obs.1"]


def test_key_order_is_the_spaces_own() -> None:
    ordered = spaces.Dict([("z", spaces.Discrete(2)), ("a", spaces.Discrete(3))])
    assert [p.name for p in obs_parts(ordered)] == ["obs.z", "obs.a"]
    plain = spaces.Dict({"z": spaces.Discrete(2), "a": spaces.Discrete(3)})  # Gymnasium sorts a plain dict's keys
    assert [p.name for p in obs_parts(plain)] == [f"obs.{k}" for k in plain.spaces]


@pytest.mark.parametrize("name", ["text", "graph", "sequence"])
def test_unsupported_observation_spaces_are_named(name: str) -> None:
    space = SPACES[name]()
    with pytest.raises(UnsupportedSpace) as info:
        obs_parts(space)
    message = str(info.value)
    assert type(space).__name__ in message and "\n" not in message
    assert message.startswith("observation:")


def test_unsupported_nested_part_names_the_part() -> None:
    with pytest.raises(UnsupportedSpace, match=r"observation part 'obs\.name': Text"):
        obs_parts(SPACES["nested_text"]())
    with pytest.raises(UnsupportedSpace, match=r"observation part 'obs\.1': OneOf"):
        obs_parts(spaces.Tuple((spaces.Discrete(2), spaces.OneOf((spaces.Discrete(2), spaces.Discrete(3))))))


# --- action_spec -------------------------------------------------------------------------------------------------


def test_action_specs_of_supported_spaces() -> None:
    assert action_spec(spaces.Discrete(4)) == ActionSpec("discrete", (), "int64", (4,))
    box = action_spec(spaces.Box(-1.0, 1.0, (2, 3), np.float64))
    assert box == ActionSpec("box", (2, 3), "float32") and box.size == 6
    multi = action_spec(spaces.MultiDiscrete([2, 5, 3]))
    assert multi == ActionSpec("multi_discrete", (3,), "int64", (2, 5, 3)) and multi.size == 3
    binary = action_spec(spaces.MultiBinary(3))
    assert binary == ActionSpec("binary", (3,), "int8") and binary.size == 3
    assert action_spec(spaces.Discrete(4)).size == 1


@pytest.mark.parametrize(
    ("space", "pattern"),
    [
        (spaces.Dict({"a": spaces.Discrete(2)}), "Dict"),
        (spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2))), "Tuple"),
        (spaces.Text(5), "Text"),
        (spaces.Discrete(3, start=1), "nonzero start"),
        (spaces.MultiDiscrete([3, 4], start=[0, 2]), "nonzero start"),
        (spaces.MultiDiscrete([[2, 3], [4, 5]]), "nvec of shape"),
        (spaces.Box(0, 5, (2,), np.int64), "float Boxes only"),
        (spaces.MultiBinary([2, 2]), "only 1-D"),
    ],
    ids=[
        "dict",
        "tuple",
        "text",
        "discrete_start",
        "multi_discrete_start",
        "multi_discrete_2d",
        "int_box",
        "binary_2d",
    ],
)
def test_action_spec_refuses(space: spaces.Space, pattern: str) -> None:
    with pytest.raises(UnsupportedSpace, match=pattern) as info:
        action_spec(space)
    assert str(info.value).startswith("action space")


def test_describe_and_check_fits_name_the_difference() -> None:
    parts = obs_parts(GoalGrid().observation_space)
    action = action_spec(spaces.MultiDiscrete([3, 3]))
    saved = describe(parts, action)
    assert saved["action"] == {"kind": "multi_discrete", "shape": [2], "nvec": [3, 3]}
    assert [o["name"] for o in saved["obs"]] == ["obs.goal", "obs.position"]
    check_fits(saved, parts, action, "ckpt")  # the same spaces fit
    with pytest.raises(ValueError, match=r"ckpt: trained for actions .*\[3, 3\].*\[3, 4\]"):
        check_fits(saved, parts, action_spec(spaces.MultiDiscrete([3, 4])), "ckpt")
    other = obs_parts(spaces.Dict({"goal": spaces.Discrete(5), "position": spaces.Box(0.0, 1.0, (2,), np.float32)}))
    with pytest.raises(ValueError, match="ckpt: trained for observations"):
        check_fits(saved, other, action, "ckpt")


# --- make_env: refusals and ShiftActions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obs", "action", "named"),
    [
        ("text", "discrete", "Text"),
        ("graph", "discrete", "Graph"),
        ("sequence", "discrete", "Sequence"),
        ("nested_text", "discrete", "'obs.name': Text"),
        ("box", "dict", "Dict"),
        ("box", "tuple", "Tuple"),
        ("box", "text", "Text"),
    ],
)
def test_make_env_refuses_unsupported_spaces_in_one_line(obs: str, action: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_env(EnvConfig(id=ENV_ID, kwargs={"obs": obs, "action": action}))
    message = str(info.value)
    assert "\n" not in message and named in message and ENV_ID in message
    assert message.startswith("env: ")
    assert CREATED[-1].closed  # the refused env was closed


def test_make_env_shifts_a_discrete_start() -> None:
    env = make_env(EnvConfig(id=ENV_ID, kwargs={"action": "discrete_start"}))
    try:
        assert isinstance(env, ShiftActions)
        assert env.action_space == spaces.Discrete(3) and env.action_space.start == 0
        assert action_spec(env.action_space) == ActionSpec("discrete", (), "int64", (3,))
        env.reset(seed=0)
        for a in (0, 1, 2):
            env.step(np.int64(a))
        assert [int(x) for x in env.unwrapped.received] == [-1, 0, 1]
        assert all(env.unwrapped.action_space.contains(x) for x in env.unwrapped.received)
    finally:
        env.close()


def test_make_env_shifts_a_multi_discrete_start() -> None:
    env = make_env(EnvConfig(id=ENV_ID, kwargs={"action": "multi_discrete_start"}))
    try:
        assert isinstance(env, ShiftActions)
        assert env.action_space == spaces.MultiDiscrete([3, 4])
        env.reset(seed=0)
        env.step(np.array([0, 0], np.int64))
        env.step(np.array([2, 3], np.int64))
        received = env.unwrapped.received
        assert [x.tolist() for x in received] == [[1, 2], [3, 5]]
        assert all(env.unwrapped.action_space.contains(x) for x in received)
    finally:
        env.close()


def test_make_env_leaves_zero_start_actions_alone() -> None:
    env = make_env(EnvConfig(id=ENV_ID, kwargs={"action": "discrete"}))
    assert isinstance(env, SpaceEnv)
    env.close()


def test_slot_envs_receive_shifted_actions() -> None:
    slot = GymSlot(EnvConfig(id=ENV_ID, kwargs={"action": "multi_discrete_start"}), 2)
    try:
        assert slot.single_action_space == spaces.MultiDiscrete([3, 4])
        slot.reset(seed=0)
        slot.step(np.array([[0, 0], [2, 1]], np.int64))
        received = [e.unwrapped.received[-1].tolist() for e in slot.venv.envs]
        assert received == [[1, 2], [3, 3]]
    finally:
        slot.close()


def test_max_episode_steps_override_applies_to_factory_envs() -> None:
    """``env.max_episode_steps`` is documented as the time-limit override; it must work for a ``module:factory``
    env such as the packaged GoalGrid task (default 10 steps), not fail its construction."""
    env = make_env(EnvConfig(id=GOAL_GRID, max_episode_steps=3))
    try:
        env.reset(seed=0)
        stay = np.array([1, 1], np.int64)  # never reaches the goal: it does not start on it
        truncated = [env.step(stay)[3] for _ in range(3)]
        assert truncated == [False, False, True]
    finally:
        env.close()


# --- flatten_obs and GymSlot over Dict observations --------------------------------------------------------------


def test_flatten_obs_of_a_batched_goal_grid_observation() -> None:
    venv = SyncVectorEnv([goal_grid for _ in range(3)])
    try:
        parts = obs_parts(venv.single_observation_space)
        raw, _ = venv.reset(seed=0)
        flat = flatten_obs(parts, raw)
        assert list(flat) == ["obs.goal", "obs.position"]
        assert flat["obs.position"].shape == (3, 2) and flat["obs.position"].dtype == np.float32
        assert flat["obs.goal"].shape == (3,) and flat["obs.goal"].dtype == np.int64
        np.testing.assert_array_equal(flat["obs.position"], raw["position"])
        np.testing.assert_array_equal(flat["obs.goal"], raw["goal"])
        for i in range(3):  # env i was reset with seed + i
            single, _ = GoalGrid().reset(seed=i)
            np.testing.assert_array_equal(flat["obs.position"][i], single["position"])
            assert flat["obs.goal"][i] == single["goal"]
    finally:
        venv.close()
    plain = np.zeros((3, 4), np.float32)
    assert flatten_obs(obs_parts(spaces.Box(-1, 1, (4,))), plain)["obs"] is plain


def _run_against_references(
    slot: GymSlot, make_ref: Callable[[], gym.Env], seed: int, actions: list[np.ndarray]
) -> tuple[int, int]:
    """Step ``slot`` and one plain env per slot env (reset with ``seed + i``, autoreset in the same step) with the
    same actions; every observation, reward, flag and final observation must agree. Returns (truncations, steps
    where some env was truncated and another was not)."""
    parts = slot.parts
    names = [p.name for p in parts]
    refs = [make_ref() for _ in range(slot.num_envs)]
    try:
        obs = slot.reset(seed=seed)
        expected = [flatten_obs(parts, r.reset(seed=seed + i)[0]) for i, r in enumerate(refs)]
        truncations = mixed = 0
        for a in actions:
            for p in parts:
                assert obs[p.name].shape == (slot.num_envs, *p.shape) and obs[p.name].dtype == np.dtype(p.dtype)
                for b in range(slot.num_envs):
                    np.testing.assert_array_equal(obs[p.name][b], expected[b][p.name])
            step = slot.step(a)
            last: dict[int, dict[str, Any]] = {}
            for b, r in enumerate(refs):
                o, reward, terminated, truncated, _ = r.step(a[b])
                assert step.reward[b] == np.float32(reward) and step.reward.dtype == np.float32
                assert step.terminated[b] == terminated and step.truncated[b] == truncated
                assert step.episode_end[b] == (terminated or truncated)
                if truncated:
                    last[b] = flatten_obs(parts, o)
                if terminated or truncated:
                    o, _ = r.reset()
                expected[b] = flatten_obs(parts, o)
            if not last:
                assert step.final_obs is None
            else:
                truncations += len(last)
                mixed += len(last) < slot.num_envs
                assert step.final_obs is not None and list(step.final_obs) == names
                for p in parts:
                    final = step.final_obs[p.name]
                    assert final.shape == (slot.num_envs, *p.shape) and final.dtype == np.dtype(p.dtype)
                    for b, values in last.items():
                        np.testing.assert_array_equal(final[b], values[p.name])
            obs = {k: v.copy() for k, v in step.obs.items()}  # the slot's arrays are reused by the next step
        return truncations, mixed
    finally:
        for r in refs:
            r.close()


def test_gym_slot_over_goal_grid_matches_plain_envs_and_keeps_final_observations() -> None:
    rng = np.random.default_rng(0)
    B = 4
    # a 3x3 grid has its goal in the centre: random walks often reach it, so episodes (and time limits) desynchronize
    slot = make_slot(EnvConfig(id=GOAL_GRID, kwargs={"size": 3, "max_steps": 4}), B)
    try:
        assert isinstance(slot, GymSlot)
        assert [p.name for p in slot.parts] == ["obs.goal", "obs.position"]
        actions = [rng.integers(0, 3, (B, 2)) for _ in range(30)]
        truncations, mixed = _run_against_references(slot, lambda: goal_grid(size=3, max_steps=4), 3, actions)
        assert truncations >= 4 and mixed >= 1  # the comparison saw time limits, some cutting only part of the slot
    finally:
        slot.close()


def test_gym_slot_final_obs_is_the_last_observation_not_the_reset_one() -> None:
    slot = GymSlot(EnvConfig(id=GOAL_GRID, kwargs={"max_steps": 3}), 2)
    try:
        obs = slot.reset(seed=1)
        start = obs["obs.position"].copy()
        right = np.array([[2, 1], [2, 1]], np.int64)  # +1 on the first axis, walls stop
        for _ in range(3):
            step = slot.step(right)
        size = 7
        reached = np.minimum(np.round(start * (size - 1)) + np.array([3, 0]), size - 1) / (size - 1)
        for b in np.flatnonzero(step.truncated):
            np.testing.assert_allclose(step.final_obs["obs.position"][b], reached[b], rtol=0, atol=1e-6)
            assert not np.array_equal(step.final_obs["obs.position"][b], step.obs["obs.position"][b])
        assert step.truncated.any()
    finally:
        slot.close()


def test_gym_slot_over_nested_tuple_and_dict_observations() -> None:
    rng = np.random.default_rng(1)
    B = 3
    slot = GymSlot(EnvConfig(id=ENV_ID, kwargs={"obs": "nested", "action": "discrete", "max_steps": 2}), B)
    try:
        assert [(p.name, p.kind) for p in slot.parts] == [
            ("obs.m", "multi_discrete"),
            ("obs.t.0", "discrete"),
            ("obs.t.1", "binary"),
            ("obs.v", "vector"),
        ]
        actions = [rng.integers(0, 3, B) for _ in range(5)]
        truncations, _ = _run_against_references(slot, lambda: space_env("nested", "discrete", 2), 5, actions)
        assert truncations == 2 * B
    finally:
        slot.close()


# --- SampleSchema ------------------------------------------------------------------------------------------------


def test_env_fields_of_goal_grid() -> None:
    env = GoalGrid()
    fields = env_fields(obs_parts(env.observation_space), action_spec(env.action_space))
    assert [(f.name, f.scope) for f in fields] == [
        ("obs.goal", Scope.OBSERVATION),
        ("obs.position", Scope.OBSERVATION),
        ("actions", Scope.STEP),
        ("rewards", Scope.STEP),
        ("terminated", Scope.STEP),
        ("truncated", Scope.STEP),
        ("final_obs.goal", Scope.STEP),
        ("final_obs.position", Scope.STEP),
    ]
    by_name = {f.name: f for f in fields}
    assert by_name["final_obs.position"] == Field("final_obs.position", (2,), "float32")
    assert by_name["actions"] == Field("actions", (2,), "int64")
    assert by_name["terminated"].dtype == "bool" and by_name["rewards"].dtype == "float32"


def test_env_fields_keep_no_final_obs_when_a_part_is_an_image() -> None:
    space = spaces.Dict({"img": spaces.Box(0, 255, (4, 84, 84), np.uint8), "v": spaces.Box(-1, 1, (3,))})
    names = [f.name for f in env_fields(obs_parts(space), action_spec(spaces.Discrete(6)))]
    assert names == ["obs.img", "obs.v", "actions", "rewards", "terminated", "truncated"]
    plain = [f.name for f in env_fields(obs_parts(spaces.Box(-1, 1, (3,))), action_spec(spaces.Discrete(6)))]
    assert plain == ["obs", "actions", "rewards", "terminated", "truncated", "final_obs"]


def test_schema_segment_layout() -> None:
    env = GoalGrid()
    schema = sample_schema(
        env.observation_space,
        env.action_space,
        [Field("logp", (), "float32"), Field("h0", (4,), "float32", Scope.SEGMENT)],
    )
    T, B = 5, 3
    seg = schema.segment(T, B)
    assert list(seg) == [
        "obs.goal",
        "obs.position",
        "actions",
        "rewards",
        "terminated",
        "truncated",
        "final_obs.goal",
        "final_obs.position",
        "logp",
        "h0",
        "version",
    ]
    expected = {
        "obs.goal": ((T + 1, B), "int64"),
        "obs.position": ((T + 1, B, 2), "float32"),
        "actions": ((T, B, 2), "int64"),
        "rewards": ((T, B), "float32"),
        "terminated": ((T, B), "bool"),
        "truncated": ((T, B), "bool"),
        "final_obs.goal": ((T, B), "int64"),
        "final_obs.position": ((T, B, 2), "float32"),
        "logp": ((T, B), "float32"),
        "h0": ((1, B, 4), "float32"),
        "version": ((T, B), "int64"),
    }
    assert {k: (v.shape, v.dtype) for k, v in seg.items()} == expected
    assert "h0" in schema and "values" not in schema
    assert [Scope.STEP.rows(T), Scope.OBSERVATION.rows(T), Scope.SEGMENT.rows(T)] == [T, T + 1, 1]


def test_schema_keeps_an_identical_duplicate_once_and_refuses_a_different_one() -> None:
    schema = SampleSchema(
        [Field("a", (2,), "float32"), Field("b", (), "int64"), Field("a", (2,), np.float32), Field("a", (2,), "f4")]
    )
    assert list(schema.fields) == ["a", "b"]
    assert list(schema.segment(3, 2)) == ["a", "b"]
    with pytest.raises(ValueError, match="'a' declared twice"):
        SampleSchema([Field("a", (2,), "float32"), Field("a", (3,), "float32")])
    with pytest.raises(ValueError, match="'a' declared twice"):
        SampleSchema([Field("a", (), "float32"), Field("a", (), "float32", Scope.SEGMENT)])
    with pytest.raises(ValueError, match="'actions' declared twice"):  # a policy field clashing with an env field
        sample_schema(spaces.Box(-1, 1, (2,)), spaces.Discrete(3), [Field("actions", (), "float32")])
    # a policy may re-declare an env field identically
    again = sample_schema(spaces.Box(-1, 1, (2,)), spaces.Discrete(3), [Field("rewards", (), "float32")])
    assert list(again.fields).count("rewards") == 1


# --- streams with a Dict-observation schema ----------------------------------------------------------------------

T, B = 4, 3


def _dict_pool(actors: int = 2, buffers: int = 2, slots: int = 2) -> SegmentPool:
    env = GoalGrid()
    schema = sample_schema(
        env.observation_space,
        env.action_space,
        [Field("logp", (), "float32"), Field("h0", (4,), "float32", Scope.SEGMENT)],
    )
    return SegmentPool.in_process(PoolLayout.of(schema, T, B, actors, buffers, slots))


def _fill_observations(pool: SegmentPool) -> None:
    """Distinct values at every (actor, buffer, t, env) of every observation part."""
    pos = pool.arrays["obs.position"]
    pos[...] = np.arange(pos.size, dtype=np.float32).reshape(pos.shape)
    goal = pool.arrays["obs.goal"]
    goal[...] = np.arange(goal.size).reshape(goal.shape) * 10 + 7


def test_pool_layout_of_a_dict_schema() -> None:
    layout = _dict_pool(actors=2, buffers=3).layout
    assert layout.obs_fields == ("obs.goal", "obs.position")
    assert layout.segment_scoped == frozenset({"h0"})
    assert layout.shape("obs.position") == (2, 3, T + 1, B, 2)
    assert layout.shape("obs.goal") == (2, 3, T + 1, B)
    assert layout.shape("h0") == (2, 3, 1, B, 4)
    assert layout.shape("final_obs.position") == (2, 3, T, B, 2)
    assert layout.fields["obs.goal"].dtype == "int64"


def test_inference_server_reads_every_part_from_the_requested_rows() -> None:
    pool = _dict_pool()
    _fill_observations(pool)
    requests, replies = InProcChannel(5), {a: InProcChannel(2) for a in range(2)}
    server = InferenceServer([pool], requests, replies)
    asked = [(1, 0, 1, 3), (0, 1, 0, 0), (1, 1, 0, 2)]  # (actor, slot, buffer, t)
    for actor, slot, buffer, t in asked:
        InferenceClient(actor, [pool], requests, replies[actor]).request(0, slot, buffer, t)
    [(policy, records)] = server.gather(8, 0.0)
    assert policy == 0 and records[:, :4].tolist() == [list(a) for a in asked]
    obs = server.observations(0, records)
    assert list(obs) == ["obs.goal", "obs.position"]
    assert obs["obs.position"].shape == (3 * B, 2) and obs["obs.position"].dtype == np.float32
    assert obs["obs.goal"].shape == (3 * B,) and obs["obs.goal"].dtype == np.int64
    for name in obs:
        expected = np.concatenate([pool.arrays[name][a, buf, t] for a, _, buf, t in asked])
        np.testing.assert_array_equal(obs[name], expected)


def test_inference_server_answer_writes_step_fields_at_t_and_segment_fields_only_at_t0() -> None:
    pool = _dict_pool()
    requests, replies = InProcChannel(5), {a: InProcChannel(2) for a in range(2)}
    server = InferenceServer([pool], requests, replies)
    # (actor, slot, buffer, t, ticket); the t == 2 request is on a segment no other request touches
    records = np.array([[0, 0, 1, 0, 11], [1, 1, 0, 2, 12], [1, 0, 1, 0, 13]], np.int32)
    n = len(records)
    actions = np.arange(n * B * 2, dtype=np.int64).reshape(n * B, 2) % 3
    logp = -np.arange(1, n * B + 1, dtype=np.float32)
    h0 = np.arange(n * B * 4, dtype=np.float32).reshape(n * B, 4) + 1.0
    server.answer(0, records, {"actions": actions, "logp": logp, "h0": h0}, version=9)
    arr = pool.arrays
    for i, (actor, _, buffer, t, _) in enumerate(records.tolist()):
        rows = slice(i * B, (i + 1) * B)
        np.testing.assert_array_equal(arr["actions"][actor, buffer, t], actions[rows])
        np.testing.assert_array_equal(arr["logp"][actor, buffer, t], logp[rows])
        assert (arr["version"][actor, buffer, t] == 9).all()
        if t == 0:
            np.testing.assert_array_equal(arr["h0"][actor, buffer, 0], h0[rows])
        else:
            assert not arr["h0"][actor, buffer].any()  # a later step never overwrites the segment's start state
    assert int((arr["version"] == 9).sum()) == n * B  # nothing else was written
    assert int((arr["h0"] != 0).any(axis=(-1, -2)).sum()) == 2
    assert replies[0].recv(8, 0.0).tolist() == [[0, 11]]
    assert replies[1].recv(8, 0.0).tolist() == [[1, 12], [0, 13]]


def test_write_answer_single_step_form() -> None:
    pool = _dict_pool()
    arr = pool.arrays
    first = {"actions": np.ones((B, 2), np.int64), "logp": np.full(B, -1.0, np.float32), "h0": np.full((B, 4), 5.0)}
    write_answer(pool, (1, 0, 0), first, 3)
    np.testing.assert_array_equal(arr["h0"][1, 0, 0], np.full((B, 4), 5.0))
    later = {"actions": np.full((B, 2), 2, np.int64), "logp": np.full(B, -2.0, np.float32), "h0": np.full((B, 4), 8.0)}
    write_answer(pool, (1, 0, 2), later, 4)
    np.testing.assert_array_equal(arr["h0"][1, 0, 0], np.full((B, 4), 5.0))  # untouched at t = 2
    np.testing.assert_array_equal(arr["actions"][1, 0, 0], first["actions"])
    np.testing.assert_array_equal(arr["actions"][1, 0, 2], later["actions"])
    np.testing.assert_array_equal(arr["logp"][1, 0, 2], later["logp"])
    assert arr["version"][1, 0].tolist() == [[3] * B, [0] * B, [4] * B, [0] * B]
    assert not arr["h0"][0].any() and not arr["h0"][1, 1].any()


class _RecordingPolicy:
    """A policy that answers with ``actions``, ``logp`` and a segment-scoped ``h0``, and records what it saw."""

    def __init__(self) -> None:
        self.seen: list[dict[str, np.ndarray]] = []

    def output_fields(self) -> tuple[Field, ...]:
        return (Field("logp", (), "float32"), Field("h0", (4,), "float32", Scope.SEGMENT))

    def act(self, obs: Mapping[str, np.ndarray], deterministic: bool = False) -> dict[str, np.ndarray]:
        self.seen.append({k: np.array(v) for k, v in obs.items()})
        n = len(obs["obs.goal"])
        step = len(self.seen)
        return {
            "actions": np.full((n, 2), step % 3, np.int64),
            "logp": np.full(n, -float(step), np.float32),
            "h0": np.full((n, 4), float(step), np.float32),
        }

    def load_flat(self, flat: np.ndarray) -> None:
        pass

    def flat_size(self) -> int:
        return 0


class _FixedVersion:
    current = 6

    def refresh(self) -> bool:
        return False

    def wait_first(self, should_stop: Callable[[], bool]) -> bool:
        return True


def test_inline_inference_reads_parts_and_writes_segment_fields_at_t0() -> None:
    pool = _dict_pool()
    _fill_observations(pool)
    policy = _RecordingPolicy()
    inline = InlineInference(1, [pool], [policy], [_FixedVersion()])
    inline.request(0, slot=1, buffer=0, t=0)
    inline.request(0, slot=0, buffer=0, t=1)
    assert inline.ready(8, 0.0).tolist() == [1, 0]
    for seen, t in zip(policy.seen, (0, 1)):
        assert list(seen) == ["obs.goal", "obs.position"]
        for name in seen:
            np.testing.assert_array_equal(seen[name], pool.arrays[name][1, 0, t])
    arr = pool.arrays
    np.testing.assert_array_equal(arr["h0"][1, 0, 0], np.full((B, 4), 1.0))  # from the t = 0 answer only
    np.testing.assert_array_equal(arr["logp"][1, 0, :2], [[-1.0] * B, [-2.0] * B])
    np.testing.assert_array_equal(arr["actions"][1, 0, 1], np.full((B, 2), 2))
    assert arr["version"][1, 0].tolist() == [[6] * B, [6] * B, [0] * B, [0] * B]


# --- ObsEncoder over every part kind -----------------------------------------------------------------------------

ENC_SPACE = spaces.Dict(
    {
        "vec": spaces.Box(-np.inf, np.inf, (3,), np.float32),
        "disc": spaces.Discrete(5, start=2),
        "multi": spaces.MultiDiscrete([3, 4], start=[1, -1]),
        "bin": spaces.MultiBinary(3),
        "img": spaces.Box(0, 255, (4, 84, 84), np.uint8),
    }
)
ENC_ORDER = ["obs.bin", "obs.disc", "obs.img", "obs.multi", "obs.vec"]  # Gymnasium sorts a plain dict's keys


def _enc_obs(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs.bin": torch.randint(0, 2, (n, 3), generator=g, dtype=torch.int8),
        "obs.disc": torch.randint(2, 7, (n,), generator=g),
        "obs.img": torch.randint(0, 256, (n, 4, 84, 84), generator=g, dtype=torch.uint8),
        "obs.multi": torch.stack([torch.randint(1, 4, (n,), generator=g), torch.randint(-1, 3, (n,), generator=g)], 1),
        "obs.vec": torch.randn(n, 3, generator=g) * 4.0 + 3.0,
    }


def _encoder(normalize_obs: bool = True) -> ObsEncoder:
    torch.manual_seed(0)
    return ObsEncoder(ENC_SPACE, (32, 16), "tanh", layer_norm=False, normalize_obs=normalize_obs)


def _one_hot(index: torch.Tensor, n: int) -> torch.Tensor:
    assert ((index >= 0) & (index < n)).all()
    return torch.nn.functional.one_hot(index.long(), n).float()


def test_obs_encoder_over_every_kind_matches_a_hand_built_feature_vector() -> None:
    enc = _encoder()
    assert [p.name for p in enc.parts] == ENC_ORDER
    assert enc.out_dim == 16
    assert enc.torso[0].in_features == 3 + 5 + 512 + (3 + 4) + 3
    fold = _enc_obs(200, seed=1)
    for rms, x in enc.normalizer_inputs(fold):
        rms.update(x)
    obs = _enc_obs(6, seed=2)
    out = enc(obs)
    assert out.shape == (6, 16) and out.dtype == torch.float32
    vec = fold["obs.vec"].double()
    mean, var = vec.mean(0), vec.var(0, unbiased=False)
    with torch.no_grad():
        features = torch.cat(
            [
                obs["obs.bin"].float(),
                _one_hot(obs["obs.disc"] - 2, 5),
                enc.cnns["obs/img"](obs["obs.img"]),
                _one_hot(obs["obs.multi"][:, 0] - 1, 3),
                _one_hot(obs["obs.multi"][:, 1] + 1, 4),
                ((obs["obs.vec"].double() - mean) / torch.sqrt(var + 1e-8)).float(),
            ],
            dim=1,
        )
        expected = enc.torso(features)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_obs_encoder_one_hot_codes_subtract_the_start() -> None:
    enc = _encoder()
    parts = {p.name: p for p in enc.parts}
    disc = enc._part(parts["obs.disc"], torch.tensor([2, 3, 6]))
    torch.testing.assert_close(disc, torch.eye(5)[[0, 1, 4]])
    multi = enc._part(parts["obs.multi"], torch.tensor([[1, -1], [3, 2], [2, 0]]))
    expected = torch.tensor(
        [
            [1, 0, 0, 1, 0, 0, 0],
            [0, 0, 1, 0, 0, 0, 1],
            [0, 1, 0, 0, 1, 0, 0],
        ],
        dtype=torch.float32,
    )
    torch.testing.assert_close(multi, expected)
    binary = enc._part(parts["obs.bin"], torch.tensor([[1, 0, 1]], dtype=torch.int8))
    torch.testing.assert_close(binary, torch.tensor([[1.0, 0.0, 1.0]]))


def test_obs_encoder_features_depend_on_the_discrete_parts() -> None:
    enc = _encoder()
    a = _enc_obs(4, seed=3)
    b = dict(a)
    b["obs.disc"] = 2 + (a["obs.disc"] - 2 + 1) % 5  # another value in every row, everything else equal
    c = dict(a)
    c["obs.multi"] = a["obs.multi"].clone()
    c["obs.multi"][:, 1] = -1 + (a["obs.multi"][:, 1] + 1 + 1) % 4
    with torch.no_grad():
        fa, fb, fc = enc(a), enc(b), enc(c)
        assert ((fa - fb).abs().amax(1) > 1e-4).all()
        assert ((fa - fc).abs().amax(1) > 1e-4).all()
        torch.testing.assert_close(enc(dict(a)), fa)


def test_obs_encoder_normalizes_only_the_vector_part() -> None:
    enc = _encoder()
    obs = _enc_obs(5, seed=4)
    inputs = enc.normalizer_inputs(obs)
    assert len(inputs) == 1 and list(enc.normalizers) == ["obs/vec"]
    rms, x = inputs[0]
    assert rms is enc.normalizers["obs/vec"] and x is obs["obs.vec"]
    assert enc.obs_normalizer is None  # only a plain observation has "the" normalizer
    assert _encoder(normalize_obs=False).normalizer_inputs(obs) == []


def test_obs_encoder_gradients_reach_the_cnn_and_the_mlp() -> None:
    enc = _encoder()
    enc(_enc_obs(3, seed=5)).square().sum().backward()
    cnn = enc.cnns["obs/img"]
    conv_grads = [m.weight.grad for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(conv_grads) == 3 and all(g is not None and g.abs().sum() > 0 for g in conv_grads)
    first = enc.torso[0]
    assert first.weight.grad is not None
    column_grads = first.weight.grad.abs().sum(0)
    assert (column_grads[3:8] > 0).sum() >= 1  # the one-hot discrete columns that were hot
    assert column_grads[8:520].sum() > 0 and column_grads[-3:].sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.torso.parameters())


@pytest.mark.parametrize(
    "space",
    [
        spaces.Dict({"v": spaces.Box(-np.inf, np.inf, (3,), np.float32)}),
        spaces.Tuple((spaces.Box(-np.inf, np.inf, (3,), np.float32),)),
    ],
    ids=["dict", "tuple"],
)
def test_obs_encoder_normalizes_a_single_nested_vector_part(space: spaces.Space) -> None:
    """A Dict or Tuple holding one vector part is normalized like that part anywhere else."""
    torch.manual_seed(0)
    enc = ObsEncoder(space, (8,), "tanh", layer_norm=False, normalize_obs=True)
    (part,) = enc.parts
    g = torch.Generator().manual_seed(6)
    data = torch.randn(500, 3, generator=g) * 5.0 + 3.0
    (rms, _), *rest = enc.normalizer_inputs({part.name: data})
    assert not rest
    rms.update(data)
    x = data[:4]
    mean, var = data.double().mean(0), data.double().var(0, unbiased=False)
    with torch.no_grad():
        expected = enc.torso(((x.double() - mean) / torch.sqrt(var + 1e-8)).float())
        torch.testing.assert_close(enc({part.name: x}), expected, rtol=1e-4, atol=1e-5)


def test_obs_encoder_of_images_only_skips_the_torso() -> None:
    enc = ObsEncoder(spaces.Box(0, 255, (4, 84, 84), np.uint8), (64,), "relu", False, True)
    assert enc.out_dim == 512 and isinstance(enc.torso, torch.nn.Identity)
    assert list(enc.normalizers) == []
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(enc({"obs": x}), enc.cnns["obs"](x))


def test_policy_and_value_nets_on_goal_grid_spaces() -> None:
    env = GoalGrid()
    torch.manual_seed(0)
    actor = PolicyNet(env.observation_space, env.action_space, hidden=(16, 16))
    critic = ValueNet(env.observation_space, hidden=(16, 16))
    venv = SyncVectorEnv([goal_grid for _ in range(5)])
    try:
        raw, _ = venv.reset(seed=0)
        obs = {k: torch.as_tensor(v) for k, v in flatten_obs(actor.encoder.parts, raw).items()}
    finally:
        venv.close()
    actions, logp = actor.act(obs)
    assert actions.shape == (5, 2) and actions.dtype == torch.int64 and ((actions >= 0) & (actions < 3)).all()
    torch.testing.assert_close(actor.evaluate(obs, actions)[0], logp, rtol=1e-5, atol=1e-5)
    assert critic(obs).shape == (5,)
    assert [len(actor.encoder.normalizer_inputs(obs)), len(critic.encoder.normalizer_inputs(obs))] == [1, 1]
