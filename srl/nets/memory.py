"""Recurrent cores: an observation encoder followed by an LSTM or a GRU (``model.core``).

A :class:`Recurrent` encoder is what a policy with memory has where a feed-forward one has its encoder; the
heads read its features as they would read the encoder's. Its state is one flat float32 vector per
environment, ``state_size`` wide (an LSTM's ``h`` then ``c``; a GRU's ``h``), so it travels through the sample
schema as one field (:data:`srl.api.schema.MEMORY`) like any other.

- Acting (:meth:`Recurrent.step`): one step for a batch of environments, each with its own state in and out.
- Training (:meth:`Recurrent.unroll`): ``L`` steps of ``n`` environments from their states at the first step,
  with ``resets[l]`` marking the environments whose state is zeroed before step ``l`` (an episode ended at
  step ``l - 1``) and ``idle[l]`` those whose state step ``l`` leaves as it was (a player waiting for its
  turn: :func:`srl.api.env.carried` is the rule). The time axis is cut only where some environment resets
  or sits idle, and each stretch between cuts runs as one call of the fused ``nn.LSTM`` / ``nn.GRU``, so
  long episodes unroll at the speed of the library's kernel rather than one Python call per step (a
  turn-based game, where some column waits at every step, unrolls one step per call). Gradients run
  through the whole unroll: truncated back-propagation through time over a segment.
- A gradient step needs the features only (:meth:`Recurrent.features`): there every episode's piece of
  every column runs as a column of its own, padded, in one fused call, whose time loop then runs once
  however often episodes end (the masked CartPole config's whole PPO update runs 1.5x faster for it;
  ``docs/benchmarks.md``). A packed sequence (``nn.utils.rnn.PackedSequence``) would need no
  padding, but on the CPU it runs 1.2-3x slower than the stretches: it leaves the fused kernel.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from srl.api.env import carried
from srl.api.schema import MEMORY

MAX_PADDING = 4
"""How many times its real rows a padded batch of episode pieces may hold (:meth:`Recurrent.features`): a few
long pieces beside many short ones pad the short ones to the long ones, and on a wide core that padded work
costs more than the stretches' extra calls."""


class Recurrent(nn.Module):
    """``encoder`` (an ``nn.Module`` with ``out_dim``), then an LSTM or GRU core of ``size`` units."""

    def __init__(self, encoder: nn.Module, kind: str, size: int) -> None:
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"model.core: expected none, lstm or gru, got {kind!r}")
        self.encoder = encoder
        self.kind, self.size = kind, int(size)
        width = int(encoder.out_dim)  # type: ignore[arg-type]  # a plugin encoder declares its int out_dim
        self.rnn: nn.LSTM | nn.GRU = nn.LSTM(width, self.size) if kind == "lstm" else nn.GRU(width, self.size)
        self.out_dim = self.size
        self.state_size = 2 * self.size if kind == "lstm" else self.size

    # The built-in encoder's normalizers stay reachable through the core (the trainer folds in their statistics).
    @property
    def obs_normalizer(self) -> nn.Module | None:
        return getattr(self.encoder, "obs_normalizer", None)

    def normalizer_inputs(self, obs: Mapping[str, Tensor]) -> list:
        inputs = getattr(self.encoder, "normalizer_inputs", None)
        return [] if inputs is None else inputs(obs)

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        raise TypeError("a recurrent encoder needs its state: call step(obs, state) or unroll(...)")

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> Tensor:
        """The state of ``n`` environments at the start of their episodes (zeros) ``[n, state_size]``."""
        return torch.zeros(n, self.state_size, device=device)

    def _split(self, state: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """A flat ``[n, state_size]`` state as what the core takes (each ``[1, n, size]``)."""
        if self.kind == "lstm":
            return (state[:, : self.size].unsqueeze(0).contiguous(), state[:, self.size :].unsqueeze(0).contiguous())
        return state.unsqueeze(0).contiguous()

    def _join(self, state: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        if isinstance(state, tuple):
            return torch.cat([state[0][0], state[1][0]], dim=1)
        return state[0]

    def step(self, obs: Mapping[str, Tensor], state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: features ``[n, size]`` and the next state ``[n, state_size]``."""
        x = self.encoder(obs)
        out, after = self.rnn(x.unsqueeze(0), self._split(state))
        return out[0], self._join(after)

    def unroll(
        self, obs: Mapping[str, Tensor], state: Tensor, resets: Tensor, idle: Tensor | None = None
    ) -> tuple[Tensor, dict[int, Tensor], Tensor]:
        """``L`` steps of ``n`` environments: ``obs`` parts time-major ``[L * n, ...]``, ``state`` ``[n, S]`` at the
        first step, ``resets`` bool ``[L, n]`` (the state is zeroed before step ``l`` where set; row 0 is
        ignored: ``state`` is the first step's), ``idle`` bool ``[L, n]`` or None (step ``l`` leaves the state
        where set as it was before it, though its features are still computed). Returns the features
        ``[L * n, size]``, time-major; the states after each step ``l`` where the unroll was cut (every step that
        precedes a reset of some environment, before that reset: what a value of a truncated episode's final
        observation is taken from), keyed by ``l``; and the state after the last."""
        return self._stretches(self.encoder(obs).reshape(*resets.shape, -1), state, resets, idle)

    def features(self, obs: Mapping[str, Tensor], state: Tensor, resets: Tensor, idle: Tensor | None = None) -> Tensor:
        """:meth:`unroll`'s features alone (what a gradient step needs), the faster way. Without idle columns,
        each episode's piece of each column becomes a column of its own (from its column's state if it opens
        the column, else from zeros), padded at its end to the longest piece, and all run in one fused call:
        the core's time loop then runs once however often episodes end, for the padded steps' extra work
        (not when the padding would exceed :data:`MAX_PADDING` times the rows: the stretches then)."""
        x = self.encoder(obs).reshape(*resets.shape, -1)
        if idle is None or not bool(idle.any()):
            features = self._pieces(x, state, resets)
            if features is not None:
                return features
        return self._stretches(x, state, resets, idle)[0]

    def _pieces(self, x: Tensor, state: Tensor, resets: Tensor) -> Tensor | None:
        """The features of every episode's piece as a column of its own, or None when padding costs too much."""
        L, n = resets.shape
        if not bool(resets[1:].any()):  # one piece per column
            return self.rnn(x, self._split(state))[0].reshape(L * n, -1)
        opens = resets.t().clone()
        opens[:, 0] = True
        col, lo = torch.nonzero(opens, as_tuple=True)  # the pieces, by column then time
        last = torch.ones_like(col, dtype=torch.bool)
        last[:-1] = col[1:] != col[:-1]
        lengths = torch.where(last, torch.full_like(lo, L), lo.roll(-1)) - lo
        longest = int(lengths.max())
        if len(col) * longest > MAX_PADDING * L * n:
            return None
        steps = torch.arange(longest, device=x.device)[:, None]
        rows = (lo[None, :] + steps) * n + col[None, :]  # [longest, pieces], time-major rows of x
        alive = steps < lengths[None, :]
        flat = x.reshape(L * n, -1)
        h0 = state[col] * (lo == 0).to(state.dtype)[:, None]
        out, _ = self.rnn(flat[rows.clamp(max=L * n - 1)], self._split(h0))  # a padded step's input is any row
        return out[alive][torch.argsort(rows[alive])]

    def _stretches(
        self, x: Tensor, state: Tensor, resets: Tensor, idle: Tensor | None
    ) -> tuple[Tensor, dict[int, Tensor], Tensor]:
        """The time axis cut where some column resets or sits idle, each stretch between cuts one fused call;
        a step where some column sits idle runs alone, its idle columns keeping their state."""
        L, n = resets.shape
        cut = resets.any(dim=1)
        cut[0] = False
        held = None
        if idle is not None and bool(idle.any()):  # each step some column sits idle at runs alone
            held = idle.any(dim=1)
            cut = cut | held
            cut[1:] |= held[:-1]
        cuts = [0] + [int(t) for t in torch.nonzero(cut).squeeze(1).tolist() if t > 0] + [L]
        outs, ends = [], {}
        h = self._split(state)
        for lo, hi in itertools.pairwise(cuts):
            if lo > 0:  # zero the state of the environments whose episode ended at step lo - 1
                keep = (~resets[lo]).to(x.dtype)[None, :, None]
                h = (h[0] * keep, h[1] * keep) if isinstance(h, tuple) else h * keep
            before = h
            out, h = self.rnn(x[lo:hi], h)
            if held is not None and bool(held[lo]):  # a stretch of one step: its idle columns keep their state
                assert idle is not None and hi == lo + 1
                h = _keep(idle[lo][None, :, None], before, h)
            outs.append(out)
            if hi < L:
                ends[hi - 1] = self._join(h)
        return torch.cat(outs).reshape(L * n, -1), ends, self._join(h)


def _keep(
    still: Tensor, before: Tensor | tuple[Tensor, Tensor], after: Tensor | tuple[Tensor, Tensor]
) -> Tensor | tuple[Tensor, Tensor]:
    """``after`` with ``before`` where ``still`` is set (an LSTM's ``(h, c)`` or a GRU's ``h``)."""
    if isinstance(after, tuple):
        assert isinstance(before, tuple)
        return (torch.where(still, before[0], after[0]), torch.where(still, before[1], after[1]))
    assert not isinstance(before, tuple)
    return torch.where(still, before, after)


@dataclass
class Sequences:
    """How a batch's rows run in time, for a recurrent encoder: ``n`` columns (segments) of ``L`` rows,
    time-major (row ``l * n + j``), with the state each column starts from, ``resets`` ``[L, n]`` (the state
    is zeroed before row ``l``: an episode ended at ``l - 1``) and ``idle`` ``[L, n]`` or None (row ``l``
    leaves the state as it was: its column sat idle); or, ``stored``, every row's own stored state."""

    states: Tensor
    """``[n, S]``: each column's state at its first row; stored: ``[rows, S]``, each row's."""
    resets: Tensor
    stored: bool = False
    idle: Tensor | None = None

    @property
    def n(self) -> int:
        return int(self.resets.shape[1])

    def columns(self, cols: Tensor, rows: int) -> Sequences:
        """The columns ``cols``, first ``rows`` rows."""
        idle = None if self.idle is None else self.idle[:rows, cols]
        return Sequences(self.states[cols], self.resets[:rows, cols], idle=idle)

    def rows(self, index: Tensor) -> Sequences:
        """Stored states: the rows ``index`` (flat), each with its own state."""
        return Sequences(self.states[index], self.resets, True)

    def zeros(self, size: int) -> Sequences:
        """The same rows for a core of ``size`` state floats that starts every column from zeros."""
        return Sequences(self.states.new_zeros(self.n, size), self.resets, idle=self.idle)


def carried_rows(
    terminated: np.ndarray, truncated: np.ndarray, alive: np.ndarray | None, device: torch.device
) -> tuple[Tensor, Tensor | None]:
    """Where an unroll over ``T`` steps' ``T + 1`` observation rows zeroes the state (``resets`` ``[T + 1, N]``:
    after an episode's end) and where a row leaves it as it was (``idle`` ``[T + 1, N]``, or None when every
    column acted at every step: a column that sat idle, ``alive`` false), as the actor carried the states
    (:func:`srl.api.env.carried`). Row ``T`` (the bootstrap observation) steps nothing."""
    ended = torch.from_numpy(np.asarray(terminated | truncated)).to(device)
    resets = torch.cat([torch.zeros_like(ended[:1]), ended])
    if alive is None or alive.all():
        return resets, None
    idle = torch.from_numpy(~np.asarray(alive, bool)).to(device)
    return resets, torch.cat([idle, torch.zeros_like(idle[:1])])


@dataclass
class After:
    """The states a recurrent encoder reached after given rows, before any reset (:func:`encode`)."""

    n: int
    ends: dict[int, Tensor] | None = None
    """Unrolled: the state after row ``l`` of every column, at the rows some column reset after."""
    flat: Tensor | None = None
    """Stepped (stored states): the state after every row, flat."""

    def states(self, t: Tensor, col: Tensor) -> Tensor:
        """The states after rows ``(t[i], col[i])``: each must be one an episode ended at (truncated)."""
        if self.flat is not None:
            return self.flat[t * self.n + col]
        assert self.ends is not None
        return torch.stack([self.ends[int(a)][int(b)] for a, b in zip(t.tolist(), col.tolist())])


def encode(
    encoder: nn.Module, obs: Mapping[str, Tensor], seq: Sequences | None, burn_in: int = 0, states: bool = True
) -> tuple[Tensor, After | None]:
    """Features of ``obs``'s rows from ``encoder``: a feed-forward one directly (``seq`` is then unused), a
    :class:`Recurrent` one unrolled over ``seq`` (the first ``burn_in`` rows of each column without gradient,
    their features detached) or stepped from each row's stored state; with the states after the rows unless
    burn-in is used or ``states`` is False (the faster :meth:`Recurrent.features` then)."""
    if seq is None or not isinstance(encoder, Recurrent):
        return encoder(obs), None
    if seq.stored:
        features, after = encoder.step(obs, seq.states)
        return features, After(seq.n, flat=after)
    L, n = seq.resets.shape
    idle = seq.idle
    if 0 < burn_in < L:
        cut = burn_in * n
        early, late = (None, None) if idle is None else (idle[:burn_in], idle[burn_in:])
        with torch.no_grad():
            warm, _, state = encoder.unroll(
                {k: x[:cut] for k, x in obs.items()}, seq.states, seq.resets[:burn_in], early
            )
        state = state * (~seq.resets[burn_in]).to(state.dtype)[:, None]
        rest = encoder.features({k: x[cut:] for k, x in obs.items()}, state, seq.resets[burn_in:], late)
        return torch.cat([warm, rest]), None
    if not states:
        return encoder.features(obs, seq.states, seq.resets, idle), None
    features, ends, _ = encoder.unroll(obs, seq.states, seq.resets, idle)
    return features, After(n, ends=ends)


def memory_size(policy: Any) -> int:
    """The state floats per environment an acting policy declares (its :data:`~srl.api.schema.MEMORY` output
    field), 0 for a policy without memory."""
    for f in policy.output_fields():
        if f.name == MEMORY:
            return int(f.shape[0])
    return 0


class Remembering:
    """An acting policy with memory, used outside the streams (evaluation, matches, ``srl.load_policy``): it
    keeps the state of each of the columns it acts on, feeds it in with their observations and keeps what comes
    back. After each step of the env, :meth:`carry` applies the rule of :func:`srl.api.env.carried` (an idle
    column keeps its state, an ended one starts afresh); :meth:`reset` zeroes columns by hand. A batch of
    another size than the last starts every column afresh. With ``keys`` (one per row, an agent id) the rows of
    a call are the keys' own states instead, whatever the batch's size and order: a turn-based game's player
    steps its state only on the moves it makes."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.size = memory_size(policy)
        self.state: np.ndarray | None = None
        self.before: np.ndarray | None = None
        self.keyed: dict[Hashable, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:  # the wrapped policy's other methods (load_flat, output_fields, ...)
        if name == "policy":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.policy, name)

    def act(
        self, obs: Mapping[str, np.ndarray], deterministic: bool = False, keys: Sequence[Hashable] | None = None
    ) -> dict[str, np.ndarray]:
        n = len(next(iter(obs.values())))
        if keys is not None:
            blank = np.zeros(self.size, np.float32)
            state = np.stack([self.keyed.get(k, blank) for k in keys]) if n else np.zeros((0, self.size), np.float32)
        else:
            if self.state is None or len(self.state) != n:
                self.state = np.zeros((n, self.size), np.float32)
            state = self.state
        out = dict(self.policy.act({**obs, MEMORY: state}, deterministic=deterministic))
        after = np.array(out.pop(MEMORY), np.float32)
        if keys is not None:
            self.keyed.update(zip(keys, after))
        else:
            self.before, self.state = state, after
        return out

    def carry(self, terminated: np.ndarray, truncated: np.ndarray, alive: np.ndarray | None) -> None:
        """The env stepped the columns of the last :meth:`act`: settle their states for the next."""
        if self.state is not None and self.before is not None and len(self.before) == len(self.state):
            carried(self.before, self.state, terminated, truncated, alive)

    def reset(self, ended: np.ndarray | None = None, keys: Iterable[Hashable] | None = None) -> None:
        """Zero the state of the columns where ``ended`` is set, or of ``keys`` (all of them when both are None)."""
        if keys is not None:
            for k in keys:
                self.keyed.pop(k, None)
            return
        if ended is None:
            self.keyed.clear()
        if self.state is None:
            return
        if ended is None:
            self.state[:] = 0.0
        else:
            self.state[np.asarray(ended, bool)] = 0.0


def act_keyed(policy: Any, obs: Mapping[str, np.ndarray], deterministic: bool, keys: Sequence[Hashable]) -> Any:
    """``policy.act`` on rows that are ``keys``' own: with memory, each row starts from its key's state
    (:class:`Remembering` with ``keys``); without, the keys change nothing."""
    if isinstance(policy, Remembering):
        return policy.act(obs, deterministic=deterministic, keys=keys)
    return policy.act(obs, deterministic=deterministic)


def forget_keys(policy: Any, keys: Iterable[Hashable]) -> None:
    """What a policy with memory remembers of ``keys`` goes (nothing to do without memory)."""
    if isinstance(policy, Remembering):
        policy.reset(keys=keys)


def remembering(policy: Any) -> Any:
    """``policy`` as it acts outside the streams: wrapped in :class:`Remembering` when it has memory."""
    return Remembering(policy) if memory_size(policy) else policy
