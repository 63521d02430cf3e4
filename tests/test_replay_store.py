"""The replay store: sampling distributions, keyed priority updates, n-step targets against a plain loop, the
rate limiter through the store, shared memory across an unclean drop, save and load, and the config checks."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srl.api.config import ConfigError, ReplayConfig
from srl.api.schema import FieldSpec
from srl.base.shm import list_segments, new_tag
from srl.replay.spec import ReplaySpec
from srl.replay.store import ReplayStore
from srl.system.streams import PoolLayout

Chunk = dict[str, np.ndarray]


@pytest.fixture
def draw() -> np.random.Generator:
    """The generator a test samples with (the replay worker owns one; the store takes it per call)."""
    return np.random.default_rng(0)


def _fields(T: int, B: int, image: bool) -> dict[str, FieldSpec]:
    """A segment layout: vector observations with their final observations, or image ones without."""
    obs = (1, 2, 2) if image else (2,)
    dtype = "uint8" if image else "float32"
    fields = {
        "obs": FieldSpec((T + 1, B, *obs), dtype),
        "actions": FieldSpec((T, B), "int64"),
        "rewards": FieldSpec((T, B), "float32"),
        "terminated": FieldSpec((T, B), "bool"),
        "truncated": FieldSpec((T, B), "bool"),
        "version": FieldSpec((T, B), "int64"),
    }
    if not image:
        fields["final_obs"] = FieldSpec((T, B, *obs), dtype)
    return fields


def _spec(T: int = 4, B: int = 3, image: bool = False, batch: int = 8, **cfg: Any) -> ReplaySpec:
    settings = {"max_size": 1000, "min_size": 1, "error_buffer": 1e9, **cfg}  # the limiter holds nothing here
    return ReplaySpec.of(PoolLayout(1, 1, _fields(T, B, image)), ReplayConfig(**settings), batch)


def _segment(spec: ReplaySpec, rng: np.random.Generator, ends: float = 0.0) -> Chunk:
    """Random data for every field; each step terminates or is truncated with probability ``ends`` each."""
    out = {}
    for name, f in spec.fields.items():
        if f.dtype == "bool":
            out[name] = rng.random(f.shape) < ends
        elif f.dtype == "uint8":
            out[name] = rng.integers(0, 256, f.shape, dtype=np.uint8)
        else:
            out[name] = rng.normal(size=f.shape).astype(f.dtype) * 10
    return out


def _batch(spec: ReplaySpec, n: int) -> Chunk:
    return {name: np.zeros(f.shape, f.dtype) for name, f in spec.batch_fields(n).items()}


def _fill(store: ReplayStore, rng: np.random.Generator, segments: int, ends: float = 0.0) -> dict[int, Chunk]:
    """Insert ``segments`` random segments; every chunk's data by its chunk key."""
    chunks: dict[int, Chunk] = {}
    for _ in range(segments):
        seg = _segment(store.spec, rng, ends)
        for column, key in enumerate(store.insert(seg)):
            chunks[int(key)] = {name: arr[:, column] for name, arr in seg.items()}
    return chunks


def _writer(tag: str, spec: ReplaySpec) -> ReplayStore:
    """The store as the replay worker attaches to it: attached, then repaired (what a kill left half done)."""
    store = ReplayStore.attach(tag, spec)
    store.repair()
    return store


def _leaf_priorities(store: ReplayStore, keys: np.ndarray) -> np.ndarray:
    """Tree leaves (priority^alpha) of live items ``keys``."""
    per, capacity = store.spec.items_per_chunk, store.spec.capacity
    chunk, offset = np.divmod(keys, per)
    assert store._priorities is not None
    return store._priorities.tree.leaves((chunk % capacity) * per + offset)


# ---------------------------------------------------------------- prioritized sampling


def _chi2_critical(df: int, p: float = 0.999) -> float:
    try:
        from scipy.stats import chi2
    except ImportError:  # Wilson-Hilferty: within 1% of the quantile for df >= 3
        z = 3.090232306167813  # the standard normal's 0.999 quantile
        return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return float(chi2.ppf(p, df))


def test_prioritized_frequencies_follow_priority_to_the_alpha(draw: np.random.Generator) -> None:
    spec = _spec(sampler="prioritized", alpha=0.6, batch=32)
    store = ReplayStore.in_process(spec)
    _fill(store, np.random.default_rng(0), 1)
    keys = np.arange(store.size)
    priorities = keys + 1.0
    assert store.update_priorities(keys, priorities) == (keys.size, 0)
    out = _batch(spec, 32)
    counts = np.zeros(keys.size)
    for _ in range(1000):
        store.sample_into(out, draw)
        np.add.at(counts, out["keys"], 1)
    expected = priorities**0.6 / (priorities**0.6).sum() * counts.sum()
    critical = _chi2_critical(keys.size - 1)
    assert ((counts - expected) ** 2 / expected).sum() < critical
    uniform = np.full(keys.size, counts.sum() / keys.size)  # the test can tell: uniform sampling is far off
    assert ((counts - uniform) ** 2 / uniform).sum() > 10 * critical


def test_importance_weights_match_hand_computed_values(draw: np.random.Generator) -> None:
    """alpha 1, beta 0.5: w_i = (N * p_i / sum p)^-0.5, divided by the batch's largest."""
    spec = _spec(sampler="prioritized", alpha=1.0, beta=0.5, batch=16)
    store = ReplayStore.in_process(spec)
    _fill(store, np.random.default_rng(1), 1)
    n_items = store.size
    priorities = np.linspace(1.0, 4.0, n_items)
    store.update_priorities(np.arange(n_items), priorities)
    out = _batch(spec, 16)
    store.sample_into(out, draw)
    w = (n_items * priorities[out["keys"]] / priorities.sum()) ** -0.5
    np.testing.assert_allclose(out["weights"], w / w.max(), rtol=1e-6)
    assert out["weights"].max() == 1.0
    store.sample_into(out, draw, beta=0.0)  # a run anneals beta per call; 0 leaves the bias uncorrected
    assert (out["weights"] == 1.0).all()


def test_new_items_enter_at_the_running_max_priority() -> None:
    spec = _spec(sampler="prioritized", alpha=0.5)
    store = ReplayStore.in_process(spec)
    rng = np.random.default_rng(2)
    _fill(store, rng, 1)
    store.update_priorities(np.array([0, 1]), np.array([9.0, 0.5]))
    new = _fill(store, rng, 1)
    per = spec.items_per_chunk
    new_items = np.array([k * per + o for k in new for o in range(per)])
    np.testing.assert_allclose(_leaf_priorities(store, new_items), 3.0)  # 9 ** 0.5


# ---------------------------------------------------------------- priority updates by key


def test_update_for_an_overwritten_item_is_dropped_and_counted(draw: np.random.Generator) -> None:
    spec = _spec(sampler="prioritized", alpha=1.0, max_size=24)  # 6 chunks: two segments of 3 columns
    store = ReplayStore.in_process(spec)
    rng = np.random.default_rng(3)
    _fill(store, rng, 2)
    out = _batch(spec, 8)
    store.sample_into(out, draw)
    sampled = out["keys"].copy()
    _fill(store, rng, 2)  # every chunk the batch came from is overwritten
    before = _leaf_priorities(store, sampled + 6 * spec.items_per_chunk)  # the newer items in the same slots
    assert store.update_priorities(sampled, np.full(8, 50.0)) == (0, 8)
    np.testing.assert_array_equal(_leaf_priorities(store, sampled + 6 * spec.items_per_chunk), before)
    assert store.stats()["stale_priorities"] == 8
    live = np.array([6 * spec.items_per_chunk, 7 * spec.items_per_chunk + 1])
    assert store.update_priorities(live, np.array([50.0, 60.0])) == (2, 0)
    np.testing.assert_allclose(_leaf_priorities(store, live), [50.0, 60.0])


def test_zero_is_floored_and_nan_inf_negative_are_refused_and_counted() -> None:
    spec = _spec(sampler="prioritized", alpha=1.0, priority_eps=0.01)
    store = ReplayStore.in_process(spec)
    _fill(store, np.random.default_rng(4), 1)
    keys = np.arange(5)
    applied, stale = store.update_priorities(keys, np.array([0.0, np.nan, np.inf, -1.0, 2.0]))
    assert (applied, stale) == (2, 0)
    np.testing.assert_allclose(_leaf_priorities(store, keys), [0.01, 1.0, 1.0, 1.0, 2.0])
    assert store.stats()["refused_priorities"] == 3
    assert store.update_priorities(np.array([-1, 10**9]), np.array([1.0, 1.0])) == (0, 2)  # never inserted


def test_a_sampler_without_priorities_counts_them_as_ignored() -> None:
    store = ReplayStore.in_process(_spec())
    _fill(store, np.random.default_rng(5), 1)
    assert store.update_priorities(np.arange(3), np.ones(3)) == (0, 0)
    assert store.stats()["ignored_priorities"] == 3


# ---------------------------------------------------------------- n-step targets


def _reference(chunk: Chunk, s: int, n: int, gamma: float, final: bool) -> tuple[float, float, np.ndarray, str]:
    """The target of step ``s`` walked step by step: (return, discount, bootstrap obs, how it ended)."""
    T = chunk["rewards"].shape[0]
    g, d = 0.0, 1.0
    for j in range(n):
        t = s + j
        if t == T:
            return g, d, chunk["obs"][T], "cut"
        before = (g, d)
        g += d * float(chunk["rewards"][t])
        d *= gamma
        if chunk["terminated"][t]:
            return g, 0.0, chunk["obs"][t + 1], "terminated"
        if chunk["truncated"][t]:
            if final:
                return g, d, chunk["final_obs"][t], "truncated"
            if j == 0:  # the step's own observation stands in for the one it never kept
                return g, d, chunk["obs"][t], "truncated"
            return before[0], before[1], chunk["obs"][t], "truncated"  # the exact target one step shorter
    return g, d, chunk["obs"][s + n], "n"


@pytest.mark.parametrize("image", [False, True])
@pytest.mark.parametrize(("item_length", "n"), [(1, 1), (1, 3), (3, 2), (2, 6)])
def test_nstep_targets_match_a_plain_loop(image: bool, item_length: int, n: int, draw: np.random.Generator) -> None:
    """Random segments with terminations, truncations (final obs, or the image stand-in) and windows cut at the
    chunk's end (obs row T): every step of every sampled item against the reference; items of several steps carry
    their steps' rewards and episode ends, items of one step none."""
    gamma = 0.9
    spec = _spec(T=6, image=image, item_length=item_length, batch=64)
    store = ReplayStore.in_process(spec)
    chunks = _fill(store, np.random.default_rng(6), 4, ends=0.12)
    out = _batch(spec, 64)
    seen = set()
    for _ in range(5):
        store.sample_into(out, draw, n=n, gamma=gamma)
        for i, key in enumerate(out["keys"].tolist()):
            chunk_key, offset = divmod(key, spec.items_per_chunk)
            chunk = chunks[chunk_key]
            for k in range(item_length):
                ret, disc, boot, how = _reference(chunk, offset + k, n, gamma, final=not image)
                seen.add(how)
                np.testing.assert_array_equal(out["obs"][k, i], chunk["obs"][offset + k])
                assert out["actions"][k, i] == chunk["actions"][offset + k]
                if item_length > 1:  # a window carries its steps' rewards and episode ends (MuZero's unroll)
                    for name in ("rewards", "terminated", "truncated"):
                        assert out[name][k, i] == chunk[name][offset + k], name
                assert out["returns"][k, i] == pytest.approx(ret, rel=1e-5, abs=1e-4)
                assert out["discounts"][k, i] == pytest.approx(disc, rel=1e-6)
                if how != "terminated":
                    np.testing.assert_array_equal(out["boot_obs"][k, i], boot)
    assert {"terminated", "truncated"} | ({"cut"} if n > 1 else set()) <= seen  # n = 1 never runs past a chunk
    assert ("rewards" in out) == (item_length > 1)


def _check_targets(store: ReplayStore, chunks: dict[int, Chunk], out: dict, n: int, gamma: float) -> None:
    """Every step of the batch in ``out`` against the plain-loop reference."""
    for i, key in enumerate(out["keys"].tolist()):
        chunk_key, offset = divmod(key, store.spec.items_per_chunk)
        for k in range(store.spec.item_length):
            ret, disc, boot, how = _reference(chunks[chunk_key], offset + k, n, gamma, final=True)
            assert out["returns"][k, i] == pytest.approx(ret, rel=1e-5, abs=1e-4)
            assert out["discounts"][k, i] == pytest.approx(disc, rel=1e-6)
            if how != "terminated":
                np.testing.assert_array_equal(out["boot_obs"][k, i], boot)


def test_targets_follow_a_change_of_n_and_gamma_and_every_later_insert(draw: np.random.Generator) -> None:
    """Targets are kept per stored step: a batch at another n or gamma gets them anew for every chunk, and chunks
    inserted after (overwriting old ones) get them at the n and gamma batches last asked for."""
    spec = _spec(T=6, item_length=2, batch=64)
    store = ReplayStore.in_process(spec)
    rng = np.random.default_rng(3)
    chunks = _fill(store, rng, spec.capacity // spec.columns, ends=0.15)
    out = _batch(spec, 64)
    for n, gamma in [(3, 0.9), (1, 0.9), (3, 0.5), (3, 0.9)]:
        chunks.update(_fill(store, rng, 2, ends=0.15))  # overwrites the oldest chunks
        for _ in range(3):
            store.sample_into(out, draw, n=n, gamma=gamma)
            _check_targets(store, chunks, out, n, gamma)


# ---------------------------------------------------------------- frame stacks


class _StackedEnvs:
    """B columns of an env whose observation is its last S frames (random 2x3 frames), the first stack of an
    episode repeating its first frame, as Gymnasium's FrameStackObservation and EnvPool make them."""

    def __init__(self, B: int, S: int, rng: np.random.Generator, ends: float) -> None:
        self.rng, self.ends = rng, ends
        self.stack = np.repeat(self._frame(B)[:, None], S, axis=1)  # [B, S, 2, 3]

    def _frame(self, B: int) -> np.ndarray:
        return self.rng.integers(0, 256, (B, 2, 3), dtype=np.uint8)

    def segment(self, T: int) -> Chunk:
        B, S = self.stack.shape[:2]
        obs = np.empty((T + 1, B, S, 2, 3), np.uint8)
        obs[0] = self.stack
        terminated = self.rng.random((T, B)) < self.ends
        truncated = (self.rng.random((T, B)) < self.ends) & ~terminated
        for t in range(T):
            new = self._frame(B)
            self.stack = np.concatenate([self.stack[:, 1:], new[:, None]], axis=1)
            reset = terminated[t] | truncated[t]
            self.stack[reset] = new[reset][:, None]  # a new episode: its first frame S times
            obs[t + 1] = self.stack
        return {
            "obs": obs,
            "actions": self.rng.integers(0, 4, (T, B)),
            "rewards": self.rng.normal(size=(T, B)).astype(np.float32),
            "terminated": terminated,
            "truncated": truncated,
            "version": np.zeros((T, B), np.int64),
        }


def _stacked_spec(T: int, B: int, S: int, **cfg: Any) -> ReplaySpec:
    fields = _fields(T, B, image=True)
    fields["obs"] = FieldSpec((T + 1, B, S, 2, 3), "uint8")
    settings = {"max_size": 1000, "min_size": 1, "error_buffer": 1e9, "frame_stacks": ("obs",), **cfg}
    return ReplaySpec.of(PoolLayout(1, 1, fields), ReplayConfig(**settings), 64)


@pytest.mark.parametrize(("T", "item_length"), [(6, 1), (6, 3), (1, 1)])
def test_frame_stacks_are_stored_once_and_restacked_exactly(
    T: int, item_length: int, draw: np.random.Generator
) -> None:
    """Episodes that end anywhere in a chunk (the next stack repeats its first frame), chunks shorter than a
    stack included: every sampled item's observations and bootstrap observations equal the stacks the env gave,
    from about a quarter of the memory."""
    B, S, n = 3, 4, min(3, T)
    spec = _stacked_spec(T, B, S, item_length=item_length)
    plain = ReplaySpec.of(PoolLayout(1, 1, dict(spec.fields)), ReplayConfig(max_size=1000), 64)
    assert spec.arrays()["field_obs"].shape == (spec.capacity, T + S, 2, 3)
    assert plain.arrays()["field_obs"].shape == (plain.capacity, T + 1, S, 2, 3)
    store = ReplayStore.in_process(spec)
    envs, chunks = _StackedEnvs(B, S, np.random.default_rng(4), ends=0.2), {}
    for _ in range(2 * spec.capacity // B):  # overwrites the first half
        seg = envs.segment(T)
        for column, key in enumerate(store.insert(seg)):
            chunks[int(key)] = {name: arr[:, column] for name, arr in seg.items()}
    out = _batch(spec, 64)
    for _ in range(4):
        store.sample_into(out, draw, n=n, gamma=0.9)
        for i, key in enumerate(out["keys"].tolist()):
            chunk_key, offset = divmod(key, spec.items_per_chunk)
            chunk = chunks[chunk_key]
            for k in range(item_length):
                np.testing.assert_array_equal(out["obs"][k, i], chunk["obs"][offset + k])
                _, _, boot, how = _reference(chunk, offset + k, n, 0.9, final=False)
                if how != "terminated":
                    np.testing.assert_array_equal(out["boot_obs"][k, i], boot)


def test_a_part_that_is_not_a_frame_stack_is_refused_at_its_first_insert() -> None:
    spec = _stacked_spec(6, 3, 4)
    seg = _StackedEnvs(3, 4, np.random.default_rng(0), ends=0.0).segment(6)
    seg["obs"][5, 1, 0] += 1  # row 5 of column 1 no longer holds row 4's frames
    with pytest.raises(ValueError, match=r"'obs' is not a frame stack .*row 5 of segment column 1"):
        ReplayStore.in_process(spec).insert(seg)


@pytest.mark.parametrize(
    ("stacks", "message"),
    [(("rgb",), "'rgb' is not an observation part"), (("obs",), r"is \[2\], not a stack of frames")],
)
def test_frame_stacks_naming_a_part_that_cannot_be_one_is_refused(stacks: tuple[str, ...], message: str) -> None:
    layout = PoolLayout(1, 1, _fields(6, 3, image=False))
    with pytest.raises(ConfigError, match=message):
        ReplaySpec.of(layout, ReplayConfig(frame_stacks=stacks), 64)


def test_frame_stacks_of_a_part_that_keeps_final_observations_are_refused() -> None:
    """Its final observations share its array (``ReplaySpec.obs_rows``), which frames cannot: one line."""
    T, B = 6, 3
    fields = {**_fields(T, B, image=False)}
    fields["obs"], fields["final_obs"] = FieldSpec((T + 1, B, 4, 2), "float32"), FieldSpec((T, B, 4, 2), "float32")
    with pytest.raises(ConfigError, match="'obs' keeps its final observations"):
        ReplaySpec.of(PoolLayout(1, 1, fields), ReplayConfig(frame_stacks=("obs",)), 64)


def test_a_saved_replay_of_frame_stacks_loads_and_restacks(tmp_path: Path, draw: np.random.Generator) -> None:
    spec = _stacked_spec(6, 3, 4)
    store = ReplayStore.in_process(spec)
    envs = _StackedEnvs(3, 4, np.random.default_rng(1), ends=0.2)
    for _ in range(10):
        store.insert(envs.segment(6))
    store.save(tmp_path / "r.npz")
    loaded = ReplayStore.in_process(spec)
    loaded.load(tmp_path / "r.npz")
    np.testing.assert_array_equal(loaded._stacks["obs"], store._stacks["obs"])
    a, b = _batch(spec, 64), _batch(spec, 64)
    store.sample_into(a, np.random.default_rng(2), n=2, gamma=0.9)
    loaded.sample_into(b, np.random.default_rng(2), n=2, gamma=0.9)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


# ---------------------------------------------------------------- uniform and fifo


def test_a_batch_carries_whether_each_step_was_taken(draw: np.random.Generator) -> None:
    """A multi-agent layout's ``alive`` flags come with each sampled step (an agent that left has idle steps)."""
    T, B = 4, 3
    fields = {**_fields(T, B, image=False), "alive": FieldSpec((T, B), "bool")}
    spec = ReplaySpec.of(PoolLayout(1, 1, fields), ReplayConfig(max_size=1000, min_size=1, error_buffer=1e9), 64)
    store = ReplayStore.in_process(spec)
    rng = np.random.default_rng(2)
    segments = [_segment(spec, rng) for _ in range(3)]
    for segment in segments:
        segment["alive"] = rng.random((T, B)) < 0.5
        store.insert(segment)
    out = _batch(spec, 64)
    store.sample_into(out, draw)
    chunk, offset = np.divmod(out["keys"], T)  # items of one step: T per chunk, chunks in insertion order
    want = [segments[c // B]["alive"][t, c % B] for c, t in zip(chunk, offset)]
    np.testing.assert_array_equal(out["alive"][0], want)


def test_uniform_covers_every_live_item_and_nothing_else(draw: np.random.Generator) -> None:
    spec = _spec(max_size=24, batch=32)  # 6 chunks
    store = ReplayStore.in_process(spec)
    _fill(store, np.random.default_rng(7), 3)  # the first segment's chunks are overwritten
    per = spec.items_per_chunk
    live = set(range(3 * per, 9 * per))
    out = _batch(spec, 32)
    drawn: set[int] = set()
    for _ in range(50):
        store.sample_into(out, draw)
        drawn.update(out["keys"].tolist())
        assert (out["weights"] == 1.0).all()
    assert drawn == live


def test_fifo_hands_out_each_item_once_in_order_and_removes_read_chunks(draw: np.random.Generator) -> None:
    spec = _spec(T=4, B=2, item_length=2, sampler="fifo", samples_per_insert=1, max_size=18, batch=4, error_buffer=None)
    store = ReplayStore.in_process(spec)  # 3 items per chunk, 6 per segment
    rng = np.random.default_rng(8)
    chunks = _fill(store, rng, 1)
    out = _batch(spec, 4)
    store.sample_into(out, draw)
    assert out["keys"].tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(out["obs"][:, 3], chunks[1]["obs"][0:2])  # item 3: chunk 1, offset 0
    assert store.size == 3  # chunk 0 was read to its end: removed
    assert not store.can_sample(4)  # two unread items
    chunks.update(_fill(store, rng, 1))
    handed = []
    while store.can_sample(4):
        store.sample_into(out, draw)
        handed += out["keys"].tolist()
    assert handed == [4, 5, 6, 7, 8, 9, 10, 11]
    assert store.size == 0 and store.stats()["sampled"] == 12


# ---------------------------------------------------------------- the rate limiter through the store


def test_rate_limiter_holds_and_releases_both_sides(draw: np.random.Generator) -> None:
    """spi 2, min_size 6, inserts of 8 items, samples of 4: error buffer max((16 + 4) / 2, 14) = 14, and the
    deficit 2 * (I - 6) - S decides."""
    spec = _spec(T=4, B=2, samples_per_insert=2, min_size=6, batch=4, error_buffer=None)
    assert spec.error_buffer == 14
    store = ReplayStore.in_process(spec)
    rng = np.random.default_rng(9)
    out = _batch(spec, 4)
    assert not store.can_sample(4)  # nothing inserted yet
    _fill(store, rng, 1)  # deficit 4
    assert not store.can_insert(8)  # 4 + 16 > 14: the inserter is ahead
    with pytest.raises(RuntimeError, match="held by the rate limiter"):
        store.insert(_segment(spec, rng))
    assert store.size == 8  # the refused insert wrote nothing
    store.sample_into(out, draw)  # deficit 0
    assert not store.can_insert(8)
    store.sample_into(out, draw)  # deficit -4
    assert store.can_insert(8)
    store.sample_into(out, draw)
    store.sample_into(out, draw)  # deficit -12
    assert not store.can_sample(4)  # -16 < -14: the sampler is ahead
    with pytest.raises(RuntimeError, match="held"):
        store.sample_into(out, draw)
    _fill(store, rng, 1)  # deficit 4
    assert store.can_sample(4)
    assert store.stats()["samples_per_insert"] == pytest.approx(16 / 10)
    assert store.inserted_steps == store.stats()["inserted_steps"] == 2 * 2 * 4  # two segments of 2 columns x 4


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["uniform", "fifo"]),
    st.integers(2, 5),
    st.integers(1, 3),
    st.integers(1, 6),
    st.integers(1, 10),
    st.data(),
)
def test_some_side_can_always_move_at_the_default_buffer(
    sampler: str, T: int, B: int, min_size: int, batch: int, data: st.DataObject
) -> None:
    """Inserts of any column count and samples of any size up to the batch, in any order: never both held (a
    queue also waits for unread items; its spec leaves room so that none is lost)."""
    L = data.draw(st.integers(1, T))
    spi = 1.0 if sampler == "fifo" else data.draw(st.sampled_from([0.5, 1.0, 3.0]))
    room = (B * (T - L + 1) + batch) * 3 + min_size
    settings = {"sampler": sampler, "samples_per_insert": spi, "min_size": min_size, "max_size": room}
    spec = _spec(T, B, batch=batch, item_length=L, error_buffer=None, **settings)
    store = ReplayStore.in_process(spec)
    rng = np.random.default_rng(0)
    for _ in range(40):
        columns, m = data.draw(st.integers(1, B)), data.draw(st.integers(1, batch))
        inserts, samples = store.can_insert(columns * spec.items_per_chunk), store.can_sample(m)
        assert inserts or samples, f"both held: {store.stats()}"
        if inserts and (not samples or data.draw(st.booleans())):
            store.insert({name: arr[:, :columns] for name, arr in _segment(spec, rng).items()})
        else:
            store.sample_into(_batch(spec, m), rng)


# ---------------------------------------------------------------- shared memory, crashes, save and load


@pytest.fixture
def tag() -> Any:
    tag = f"srl_{new_tag()}_replay"
    yield tag
    assert list_segments(tag[len("srl_") :]) == [], "a replay segment was left behind"


@contextlib.contextmanager
def _controller(tag: str, spec: ReplaySpec) -> Iterator[None]:
    """The store's segments for the length of a test, created and removed as the controller does."""
    store = ReplayStore.create(tag, spec)
    try:
        yield
    finally:
        store.close(unlink=True)


def _state(store: ReplayStore) -> dict[str, Any]:
    """Everything a restarted worker must find: chunks, tree, counters."""
    arrays = {f"field_{name}": arr.copy() for name, arr in store._chunks.items()}
    arrays["counters"] = store._counters.copy()
    assert store._priorities is not None
    arrays["tree"] = store._priorities.tree.array.copy()
    return {**arrays, "max_priority": store._priorities.max_priority, "stats": store.stats()}


def _assert_same(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], np.ndarray):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        else:
            assert a[name] == b[name], name


def test_a_worker_dropped_without_closing_finds_every_item_and_priority_again(
    tag: str, draw: np.random.Generator
) -> None:
    spec = _spec(sampler="prioritized", max_size=24)
    with _controller(tag, spec):
        worker = _writer(tag, spec)
        _fill(worker, np.random.default_rng(10), 3)
        worker.update_priorities(np.array([12, 13, 20]), np.array([7.0, 0.0, np.nan]))
        out = _batch(spec, 8)
        worker.sample_into(out, draw)
        before = _state(worker)
        del worker  # killed: nothing closed, nothing flushed
        gc.collect()
        again = _writer(tag, spec)
        _assert_same(_state(again), before)
        again.close()


def test_close_unmaps_every_segment_at_once(tag: str, draw: np.random.Generator) -> None:
    """After a batch the store holds views of its segments in its reader, tree and last checked batch; closing it
    must still unmap them all, not leave them to the garbage collector."""
    spec = _spec(sampler="prioritized", max_size=24, frame_stacks=("obs",), image=True)
    store = ReplayStore.create(tag, spec)
    _fill(store, np.random.default_rng(10), 3)
    store.sample_into(_batch(spec, 8), draw)
    assert tag in Path("/proc/self/maps").read_text()
    gc.disable()  # the check must not depend on a collection running first
    try:
        store.close(unlink=True)
        mapped = Path("/proc/self/maps").read_text()
    finally:
        gc.enable()
    assert tag not in mapped


def test_a_worker_killed_with_sigkill_leaves_every_item_and_priority(tag: str) -> None:
    """A real replay worker process attaches, inserts, sets priorities and is killed -9; the next one finds it all."""
    spec = _spec(sampler="prioritized", max_size=24)
    child = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import numpy as np
from test_replay_store import _fill, _spec
from srl.replay.store import ReplayStore
store = ReplayStore.attach({tag!r}, _spec(sampler="prioritized", max_size=24))
store.repair()
_fill(store, np.random.default_rng(20), 3)
store.update_priorities(np.array([12, 13]), np.array([7.0, 3.0]))
os.kill(os.getpid(), signal.SIGKILL)
"""
    reference = ReplayStore.in_process(spec)  # the same inserts in this process
    chunks = _fill(reference, np.random.default_rng(20), 3)
    reference.update_priorities(np.array([12, 13]), np.array([7.0, 3.0]))
    with _controller(tag, spec):
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
        assert proc.returncode == -9, proc.stderr
        again = _writer(tag, spec)
        assert (again.size, again.slots.first, again.limiter.inserts) == (24, 3, 36)
        for key in range(3, 9):
            for name, arr in chunks[key].items():
                np.testing.assert_array_equal(again._chunks[name][key % spec.capacity], arr)
        _assert_same(_state(again), _state(reference))
        again.close()


def test_a_kill_mid_insert_leaves_no_half_written_chunk_live(tag: str, draw: np.random.Generator) -> None:
    """The chunks an insert overwrites are dead before it writes; the new ones live only once written."""

    class Killed(Exception):
        pass

    class DiesMidWrite(dict):
        def items(self) -> Any:
            for i, item in enumerate(super().items()):
                if i == 3:
                    raise Killed
                yield item

    spec = _spec(sampler="prioritized", max_size=24)
    with _controller(tag, spec):
        worker = _writer(tag, spec)
        rng = np.random.default_rng(11)
        chunks = _fill(worker, rng, 2)
        with pytest.raises(Killed):
            worker.insert(DiesMidWrite(_segment(spec, rng)))
        del worker
        again = _writer(tag, spec)
        assert again.size == 3 * spec.items_per_chunk and again.slots.first == 3  # segment 1 retired, 2 intact
        for key in range(3, 6):
            for name, arr in chunks[key].items():
                np.testing.assert_array_equal(again._chunks[name][key % spec.capacity], arr)
        out = _batch(spec, 8)
        for _ in range(20):
            again.sample_into(out, draw)
            assert (out["keys"] >= 3 * spec.items_per_chunk).all()
        again.close()


def test_attach_gives_items_published_without_priorities_the_running_max(tag: str) -> None:
    """A kill after the chunk keys were published but before their priorities were set leaves leaves at 0: the
    writer's repair gives them the running max; a reader's attach leaves them as they are."""
    spec = _spec(sampler="prioritized", alpha=1.0)
    with _controller(tag, spec):
        worker = _writer(tag, spec)
        _fill(worker, np.random.default_rng(12), 2)
        worker.update_priorities(np.array([0]), np.array([5.0]))
        newest = np.arange(3 * spec.items_per_chunk, 6 * spec.items_per_chunk)
        assert worker._priorities is not None
        worker._priorities.tree.update(newest, np.zeros(newest.size))  # as if killed before setting them
        del worker
        reader = ReplayStore.attach(tag, spec)  # a reader beside the writer (a reanalyze worker) writes nothing
        np.testing.assert_allclose(_leaf_priorities(reader, newest), 0.0)
        reader.close()
        again = _writer(tag, spec)
        np.testing.assert_allclose(_leaf_priorities(again, newest), 5.0)
        again.close()


def test_save_and_load_round_trip(tmp_path: Path, draw: np.random.Generator) -> None:
    spec = _spec(sampler="prioritized", max_size=24)
    store = ReplayStore.in_process(spec)
    chunks = _fill(store, np.random.default_rng(13), 3)
    store.update_priorities(np.arange(12, 20), np.arange(1.0, 9.0))
    store.sample_into(_batch(spec, 8), draw)
    path = tmp_path / "replay.npz"
    store.save(path)
    with np.load(path, allow_pickle=False) as data:  # a plain .npz: the live chunks in key order, across the wrap
        np.testing.assert_array_equal(data["field_obs"], np.stack([chunks[k]["obs"] for k in range(3, 9)]))
    loaded = ReplayStore.in_process(spec)
    loaded.load(path)
    _assert_same(_state(loaded), _state(store))
    smaller = ReplayStore.in_process(_spec(sampler="prioritized", max_size=12))  # 3 chunks: the newest kept
    smaller.load(path)
    assert smaller.slots.first == 6 and smaller.size == 12
    for key in range(6, 9):
        np.testing.assert_array_equal(smaller._chunks["obs"][key % 3], chunks[key]["obs"])
    keys = np.arange(6 * 4, 9 * 4)
    np.testing.assert_allclose(_leaf_priorities(smaller, keys) ** (1 / 0.6), _leaf_priorities(store, keys) ** (1 / 0.6))
    with pytest.raises(ValueError, match="the store is not empty"):
        loaded.load(path)


def test_what_a_killed_save_left_is_swept_before_the_next(tmp_path: Path) -> None:
    from srl.replay.file import sweep_partial_saves

    target = tmp_path / "replay0.npz"
    for name in (".replay0.npz.0a1b2c.tmp", ".replay0.npz.ffffff.tmp", ".replay1.npz.0a1b2c.tmp", "replay0.npz"):
        (tmp_path / name).write_bytes(b"x")
    assert sweep_partial_saves(target) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".replay1.npz.0a1b2c.tmp", "replay0.npz"]


def test_a_uniform_replay_loads_into_a_prioritized_one_at_the_running_max(tmp_path: Path) -> None:
    uniform = ReplayStore.in_process(_spec())
    _fill(uniform, np.random.default_rng(14), 1)
    uniform.save(tmp_path / "r.npz")
    prioritized = ReplayStore.in_process(_spec(sampler="prioritized"))
    prioritized.load(tmp_path / "r.npz")
    np.testing.assert_allclose(_leaf_priorities(prioritized, np.arange(prioritized.size)), 1.0)


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ({"image": True}, "its field 'obs' is float32 [5, 2] per chunk, this run's uint8 [5, 1, 2, 2]"),
        ({"T": 5}, "its field 'actions' is int64 [4] per chunk, this run's int64 [5]"),
        ({"item_length": 2}, "its items are 1 steps, this run's 2"),
    ],
)
def test_a_file_of_another_layout_is_refused_in_one_line(tmp_path: Path, other: dict, message: str) -> None:
    store = ReplayStore.in_process(_spec())
    _fill(store, np.random.default_rng(15), 1)
    store.save(tmp_path / "r.npz")
    with pytest.raises(ValueError) as info:
        ReplayStore.in_process(_spec(**other)).load(tmp_path / "r.npz")
    assert str(info.value) == f"replay file {tmp_path / 'r.npz'}: {message}"


# ---------------------------------------------------------------- spec, batch and config checks


def test_spec_refuses_what_cannot_work_with_the_layout() -> None:
    with pytest.raises(ConfigError, match=r"replay.item_length: 5 steps do not fit in segments of 4"):
        _spec(item_length=5)
    with pytest.raises(ConfigError, match=r"replay.max_size: 4 items hold 1 segment columns.*at least 12"):
        _spec(max_size=4, min_size=1)
    with pytest.raises(ConfigError, match=r"replay.error_buffer: error_buffer must be >= "):
        _spec(error_buffer=1.0, samples_per_insert=8)
    with pytest.raises(ConfigError, match=r"replay.max_size: a fifo queue .* needs room for 24 items"):
        _spec(sampler="fifo", samples_per_insert=1, max_size=20, error_buffer=None)
    layout = PoolLayout(1, 1, _fields(4, 3, False), segment_scoped=frozenset({"version"}))
    with pytest.raises(NotImplementedError, match="segment-scoped fields"):
        ReplaySpec.of(layout, ReplayConfig(item_length=2, min_size=1), 8)


def test_a_batch_of_the_wrong_shape_is_refused(draw: np.random.Generator) -> None:
    spec = _spec()
    store = ReplayStore.in_process(spec)
    _fill(store, np.random.default_rng(16), 1)
    out = _batch(spec, 8)
    out["returns"] = np.zeros((1, 7), np.float32)
    with pytest.raises(ValueError, match=r"batch field 'returns' is float32 \(1, 7\), expected float32 \(1, 8\)"):
        store.sample_into(out, draw)
    bad = _segment(spec, np.random.default_rng(17))
    bad["rewards"] = bad["rewards"].astype(np.float64)
    with pytest.raises(ValueError, match="segment field 'rewards' is float64"):
        store.insert(bad)


def test_batch_fields_shapes() -> None:
    spec = _spec(T=6, image=True, item_length=3)
    fields = spec.batch_fields(5)
    assert fields["obs"] == fields["boot_obs"] == FieldSpec((3, 5, 1, 2, 2), "uint8")
    assert fields["actions"] == FieldSpec((3, 5), "int64")
    assert fields["returns"] == fields["discounts"] == FieldSpec((3, 5), "float32")
    assert fields["weights"] == FieldSpec((5,), "float32") and fields["keys"] == FieldSpec((5,), "int64")
    assert not spec.has_final_obs and dataclasses.replace(spec, fields=_fields(6, 3, False)).has_final_obs


def test_a_queue_samples_each_item_once() -> None:
    with pytest.raises(ConfigError, match="samples_per_insert: a fifo queue hands out each item once: must be 1"):
        ReplayConfig(sampler="fifo", samples_per_insert=2)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("replay.min_size=2000000", "replay.min_size: 2000000 items before the first sample never fit in max_size"),
        ("replay.samples_per_insert=0", "replay.samples_per_insert: must be > 0, got 0.0"),
        ("replay.alpha=1.5", "replay.alpha: must be in [0, 1], got 1.5"),
        ("replay.item_length=33", "replay.item_length: items of 33 steps do not fit in segments of 32"),
    ],
)
def test_bad_replay_settings_exit_2_in_one_line(tmp_path: Path, override: str, needle: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "train",
            "configs/cartpole_ppo.yaml",
            "--run-dir",
            str(tmp_path / "r"),
            "--set",
            override,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("hide_cpprb", [False, True])
def test_bench_reports_every_measure_and_says_when_cpprb_is_missing(
    monkeypatch: pytest.MonkeyPatch, hide_cpprb: bool
) -> None:
    """What the report holds, not the rates (benchmarks measure those)."""
    import importlib.util

    from srl.api.config import load_config
    from srl.bench.replay import bench_replay

    if hide_cpprb:
        monkeypatch.setitem(sys.modules, "cpprb", None)  # import cpprb raises ImportError
    cpprb = not hide_cpprb and importlib.util.find_spec("cpprb") is not None  # not a project dependency
    cfg = load_config("configs/cartpole_dqn.yaml", ["replay.max_size=1024", "replay.min_size=1"])
    rows = list(bench_replay(cfg, batch=32, repeats=1, number=2))
    measured = {(r["measure"], r["impl"]) for r in rows if "measure" in r}
    expected = {
        ("insert", "srl_uniform"),
        ("insert", "srl_prioritized"),
        ("uniform_sample", "srl"),
        ("uniform_sample", "numpy_ring"),
        ("prioritized_sample_update", "srl"),
    }
    assert measured == expected | ({("prioritized_sample_update", "cpprb")} if cpprb else set())
    assert all(r["items_per_s"] > 0 for r in rows if "measure" in r)
    assert cpprb or rows[-1]["note"] == "not installed"


def test_bench_replay_refuses_an_on_policy_config_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "bench", "replay", "--config", "configs/cartpole_ppo.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "learns on-policy" in lines[0], proc.stderr


# ---------------------------------------------------------------- stored steps by key (reanalysis)


def test_refreshed_step_targets_land_only_on_steps_whose_key_still_names_them(draw):
    """A search's refreshed policy is written back by step key: to the very step read, while its chunk lives;
    once the chunk is overwritten, the old key is refused and the new data is left as inserted. Only a field the
    acting policy stored can be written; each step's observation reads back as inserted."""
    T, B = 4, 2
    fields = {**_fields(T, B, image=False), "search_policy": FieldSpec((T, B, 3), "float32")}
    spec = ReplaySpec.of(PoolLayout(1, 1, fields), ReplayConfig(max_size=32, min_size=1, error_buffer=1e9), 16)
    assert spec.carried == ("search_policy",) and spec.capacity == 8
    store = ReplayStore.in_process(spec)
    chunks = _fill(store, draw, 2)  # 4 chunks of 8 slots
    keys = store.draw_steps(32, draw)
    obs = {"obs": np.zeros((32, 2), np.float32)}
    assert store.read_steps(keys, obs).all()
    for key, row in zip(keys, obs["obs"]):
        chunk, step = divmod(int(key), T)
        np.testing.assert_array_equal(row, chunks[chunk]["obs"][step])
    fresh = draw.random((32, 3)).astype(np.float32)
    assert store.write_steps(keys, "search_policy", fresh) == (32, 0)
    batch = _batch(spec, 16)
    store.sample_into(batch, draw)
    for item, column in zip(batch["keys"], range(16)):  # items of one step: item key = step key
        hits = np.flatnonzero(keys == item)
        want = fresh[hits[-1]] if len(hits) else chunks[int(item) // T]["search_policy"][int(item) % T]
        np.testing.assert_array_equal(batch["search_policy"][0, column], want)
    _fill(store, draw, 4)  # 8 more chunks: every old chunk is overwritten
    before = {name: arr.copy() for name, arr in store._chunks.items()}
    assert store.write_steps(keys, "search_policy", fresh) == (0, 32)
    assert not store.read_steps(keys, obs).any()
    for name, arr in store._chunks.items():
        np.testing.assert_array_equal(arr, before[name])
    with pytest.raises(ValueError, match="'rewards' is not a step field the acting policy stored"):
        store.write_steps(keys, "rewards", np.zeros(32, np.float32))
    assert len(ReplayStore.in_process(spec).draw_steps(5, draw)) == 0
