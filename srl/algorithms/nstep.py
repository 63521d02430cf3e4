"""n-step returns of replay items, computed when an item is sampled.

The replay worker computes these at sampling time, so ``n`` can change without re-inserting anything; the
algorithms' targets (DQN, SAC, R2D2) are written against these conventions, so the math lives with them and the
replay imports it (numpy only: no network, no torch).

Conventions (the replay item layout follows them). An item is a sequence of ``L`` consecutive steps of one
environment. Step ``k`` holds the observation the agent acted on, its action, and what the environment
returned for that action: the reward ``rewards[k]`` and the flags ``terminated[k]`` / ``truncated[k]``
(Gymnasium's meaning: the episode ended with that action, by reaching a terminal state or by a time
limit). The *next observation of step k* is the observation the environment returned for step ``k``'s
action: the observation of step ``k + 1`` when the episode goes on and ``k + 1 < L``, the environment's
final observation (never the reset observation that follows it) when step ``k`` was truncated, and an
observation stored beside the item when ``k`` is the item's last step. After a terminated step there is
nothing to bootstrap from, so its next observation is never read.
"""

from __future__ import annotations

import numpy as np

__all__ = ["chunk_targets", "nstep"]


def nstep(
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    n: int,
    lengths: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step return targets for the FIRST step of each of ``B`` items (arrays ``[B, L]``).

    Let ``m`` be the number of steps taken: up to and including the first step that terminated or was
    truncated, at most ``n``, and at most ``lengths[b]`` where given (the steps item ``b`` holds: a row whose
    data stops early is cut there, and its last step's next observation is the one stored beside it, as for
    ``k = L - 1``; what lies past it is never read). Then, per item ``b``:

    - ``returns[b] = sum_{k < m} gamma^k * rewards[b, k]``;
    - ``discounts[b] = gamma^m`` when the episode goes on after step ``m - 1`` or was truncated there (a
      time limit is not a terminal state, so the value of the final observation still counts), and ``0``
      when it terminated there (a step both terminated and truncated counts as terminated);
    - ``boot_index[b] = m - 1``, the step whose next observation (see the module docstring) the target
      bootstraps from: ``target = returns + discounts * V(next observation of step boot_index)``.

    Steps after the first episode end (the next episode's, within the same item) never enter the sums.
    Returns are in ``rewards``' float dtype (float32 for integer rewards), ``boot_index`` is int64.
    Raises ValueError on shapes that differ or are not ``[B, L]``, ``n`` outside ``[1, L]``, ``gamma``
    outside ``[0, 1]``, or ``lengths`` not ``[B]`` integers in ``[1, L]``.
    """
    _check(rewards, terminated, truncated, gamma, n)
    if lengths is not None:
        _check_lengths(lengths, rewards.shape)
    dtype = rewards.dtype if np.issubdtype(rewards.dtype, np.floating) else np.dtype(np.float32)
    batch = rewards.shape[0]
    returns = np.zeros(batch, dtype)
    steps = np.zeros(batch, np.int64)
    ended = np.zeros(batch, bool)
    hit_terminal = np.zeros(batch, bool)
    for k in range(n):
        going = ~ended
        # where(), not a product: a reward past the episode end must not leak in, even if it is inf or NaN.
        returns += np.where(going, dtype.type(gamma**k) * rewards[:, k].astype(dtype), 0)
        steps += going
        hit_terminal |= going & terminated[:, k].astype(bool)
        ended |= going & (terminated[:, k].astype(bool) | truncated[:, k].astype(bool))
        if lengths is not None:  # the row's data ends: a cut, not an episode end (the discount stays)
            ended |= k + 1 >= lengths
    discounts = np.where(hit_terminal, 0, np.power(dtype.type(gamma), steps)).astype(dtype)
    return returns, discounts, steps - 1


def chunk_targets(
    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float, n: int, stand_in: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The n-step targets of EVERY step of ``C`` stored sequences of ``T`` steps (arrays ``[C, T]``), each
    window cut at its sequence's end: step ``s`` takes ``m`` steps, at most ``n`` and at most ``T - s``
    (:func:`nstep`), and its target is ``returns + discounts * V(observation row boot)``, where observation row
    ``r`` of a sequence is the one step ``r`` acts on and row ``T`` the one after its last step.

    Returns ``returns``, ``discounts`` (``[C, T]``, rewards' float dtype), ``boot`` (int64 ``[C, T]``: the row
    after the last step taken) and ``cut`` (bool ``[C, T]``: that last step was truncated by a time limit, not
    terminated). At a cut, the true bootstrap is that step's *final* observation, which the row
    after it is not (it is the next episode's first). A caller that keeps final observations reads that one
    there. With ``stand_in``, the observation of the truncated step itself stands in (``boot`` moves back one
    row): with ``m >= 2`` the target drops that step (its reward out, discount ``gamma^(m-1)``), which is the
    exact ``m - 1``-step target, since that observation is the next observation of the step before; with
    ``m = 1`` it is ``r + gamma * V(s_t)``, the stand-in PPO uses for ``V(s_{t+1})`` at a time limit.
    """
    C, T = rewards.shape
    steps = np.arange(T, dtype=np.int64)
    lengths = np.minimum(T - steps, n)
    window = steps[:, None] + np.minimum(np.arange(n), lengths[:, None] - 1)  # [T, n], never past the end
    flat = (np.arange(C, dtype=np.int64)[:, None, None] * T + window[None]).reshape(C * T, n)
    r = rewards.reshape(-1)[flat]
    returns, discounts, taken = nstep(
        r, terminated.reshape(-1)[flat], truncated.reshape(-1)[flat], gamma, n, np.tile(lengths, C)
    )
    last = np.tile(steps, C) + taken
    flat_last = np.repeat(np.arange(C, dtype=np.int64) * T, T) + last
    cut = truncated.reshape(-1)[flat_last] & ~terminated.reshape(-1)[flat_last]
    boot = last + 1
    if stand_in and cut.any():
        boot[cut] -= 1
        drop = np.flatnonzero(cut & (taken >= 1))
        power = np.power(returns.dtype.type(gamma), taken[drop]).astype(returns.dtype)
        returns[drop] -= power * r[drop, taken[drop]]
        discounts[drop] = power
    return returns.reshape(C, T), discounts.reshape(C, T), boot.reshape(C, T), cut.reshape(C, T)


def _check(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float, n: int) -> None:
    """One clear error for each kind of bad input."""
    if rewards.ndim != 2:
        raise ValueError(f"nstep: rewards must be [B, L] (items x steps), got shape {rewards.shape}")
    if terminated.shape != rewards.shape or truncated.shape != rewards.shape:
        raise ValueError(
            f"nstep: terminated {terminated.shape} and truncated {truncated.shape} must have rewards' shape "
            f"{rewards.shape}"
        )
    length = rewards.shape[1]
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= length:
        raise ValueError(f"nstep: n={n} must be between 1 and the item length {length}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"nstep: gamma={gamma} must be in [0, 1]")


def _check_lengths(lengths: np.ndarray, shape: tuple[int, ...]) -> None:
    """``lengths`` must give each of the B rows between 1 and L steps."""
    if lengths.shape != shape[:1] or lengths.dtype.kind not in "iu":
        raise ValueError(
            f"nstep: lengths must be {shape[:1]} integers (one per item), got {lengths.dtype} {lengths.shape}"
        )
    if lengths.size and not (lengths.min() >= 1 and lengths.max() <= shape[1]):
        raise ValueError(f"nstep: lengths must lie in [1, {shape[1]}], got min {lengths.min()} max {lengths.max()}")
