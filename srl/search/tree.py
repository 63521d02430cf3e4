"""A batch of search trees in preallocated arrays: Gumbel root selection with sequential halving, and PUCT.

Every tree of the batch takes one simulation at a time, in step with the others, so that the leaves of all of them
are evaluated in one batch (by whoever holds the model: a policy worker, an actor's game clones):

    trees.reset(logits, values, legal, rng)          # the roots, evaluated
    for _ in range(trees.simulations):
        parents, actions = trees.select()            # each tree's next edge to expand (or a terminal revisited)
        ...                                          # evaluate the children: a game step or a dynamics network
        trees.expand(logits, values, legal, rewards, discounts, terminal)   # the new nodes, backed up
    trees.root_action(), trees.policy(), trees.root_value()

Tree ``b``'s nodes are rows of arrays ``[B, simulations + 1]`` (and ``[B, simulations + 1, A]``); node 0 is its root
and simulation ``s`` creates node ``s + 1`` (:attr:`Trees.new_node`) in every tree that expands one, so a caller keeps
its own per-node state (a game, a latent) in an array indexed the same way. Values are from the view of the player to
move at a node; the edge into a node carries the reward of the move (to the player who made it) and a discount, so
``Q(parent, a) = reward + discount * V(child)``: the discount is -1 in a two-player zero-sum game of alternate turns
(the value changes sides), the env's discount in a one-player env.

The rules (Danihelka et al., "Policy improvement by planning with Gumbel", 2022, and AlphaZero's PUCT):

- ``gumbel``: at the root, ``considered`` actions drawn without replacement by Gumbel-top-k on the prior, then
  sequential halving among them (:func:`considered_visits`) by ``g + logits + sigma(q)``, where
  ``sigma(q) = (c_visit + max_b N(b)) * c_scale * q`` of the min-max normalised completed Q values (an unvisited
  action's Q is the value mixing the network's value with the visited actions' Q, weighted by their prior). The
  action played is the best of the most visited; the policy target is ``softmax(logits + sigma(completed Q))``
  and the value the completed Q expected under it.
  Below the root, the action whose visit share falls most short of that improved policy.
- ``puct``: ``q + c_puct * P(a) * sqrt(N(s)) / (1 + N(a))`` with the same normalised completed Q, and Dirichlet
  noise on the root's prior when ``dirichlet_fraction`` > 0; the action played is the most visited, the target the
  visit counts.
- ``prior``: no simulation (:attr:`Trees.simulations` is 0): the root's prior plays, its most likely legal action
  (with Gumbel draws, a draw from it); the network alone, to set beside its search.

Why vectorized numpy over all trees, not one tree at a time nor native code: one simulation is a few array
operations per tree level over every tree at once, so Python's cost is per level, not per tree. Measured
(``srl bench search``, docs/benchmarks.md "Search"): 4.9 us per tree-simulation with 256 trees in step against 321 us
one tree at a time; on the real game a Connect Four child position alone costs 17.3 us, so native code for the tree
would save at most a fifth of AlphaZero's search. MuZero's leaves cost no game: there the tree is about 55% of the
search (2 actions, 16 simulations: 27.6 of 50.6 us per tree-simulation at 16 trees, 3.9 of 7.0 us at 256), so a
native tree could make MuZero's search up to twice as fast; not yet built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from srl.api.config.search import SearchConfig

_EPS = 1e-8


@cache
def considered_visits(considered: int, simulations: int) -> tuple[int, ...]:
    """Sequential halving's schedule at the root: for each simulation, the visit count an action must have to be
    chosen. Each phase gives every remaining action the same number of visits, ``simulations / (log2(considered)
    * remaining)`` (at least one), then keeps the better half (at least 2); one action is visited every time."""
    if considered <= 1:
        return tuple(range(simulations))
    phases = math.ceil(math.log2(considered))
    out: list[int] = []
    count, remaining = 0, considered
    while len(out) < simulations:
        for _ in range(max(1, simulations // (phases * remaining))):
            out.extend([count] * remaining)
            count += 1
        remaining = max(2, remaining // 2)
    return tuple(out[:simulations])


def log_prior(logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """Log-probabilities of the legal actions (``-inf`` for the others; all ``-inf`` where none is legal)."""
    x = np.where(legal, np.asarray(logits, np.float64), -np.inf)
    top = x.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):  # a row with no legal action: -inf throughout
        norm = np.log(np.exp(x - top).sum(axis=-1, keepdims=True))
        return np.where(legal, x - top - norm, -np.inf)


def _softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of values with ``-inf`` for excluded entries (at least one finite)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class Searched:
    """A batch's searches: the action each row plays, its policy and value targets, and whether it was searched
    (a game's row that is a seat waiting for the opponent is not: its action is never played, its targets are 0)."""

    actions: np.ndarray
    policy: np.ndarray
    value: np.ndarray
    searched: np.ndarray


class Trees:
    """``batch`` search trees over ``actions`` discrete actions, taking ``settings.simulations`` simulations."""

    def __init__(self, batch: int, actions: int, settings: SearchConfig) -> None:
        self.settings = settings
        self.simulations = 0 if settings.rule == "prior" else settings.simulations
        """Simulations each search takes (none for ``prior``)."""
        b, n, a = batch, self.simulations + 1, actions
        self.visits = np.zeros((b, n), np.int64)
        self.value_sum = np.zeros((b, n))
        """The sum of the values backed up through a node, from the view of its player to move."""
        self.value = np.zeros((b, n))
        """The evaluation of a node when it was created (0 at a terminal node)."""
        self.reward = np.zeros((b, n))
        self.discount = np.ones((b, n))
        self.parent = np.full((b, n), -1, np.int64)
        self.children = np.full((b, n, a), -1, np.int64)
        self.logits = np.full((b, n, a), -np.inf)
        """Each node's log prior over its actions (``-inf``: illegal)."""
        self.terminal = np.zeros((b, n), bool)
        self.gumbel = np.zeros((b, a))
        self.considered = np.zeros(b, np.int64)
        self.new_node = 1
        """The node the next :meth:`expand` creates in every tree that expands one."""
        self.parents = np.zeros(b, np.int64)
        self.actions = np.zeros(b, np.int64)
        self.revisits = np.zeros(b, bool)
        """Where the last :meth:`select` ended at a terminal node already in the tree (nothing to evaluate)."""
        self._leaf = np.zeros(b, np.int64)
        self._rows = np.arange(b)
        self._schedule = np.array([considered_visits(m, settings.simulations) for m in range(settings.considered + 1)])
        """Sequential halving's schedule of each count of considered actions, ``[considered + 1, simulations]``."""

    @property
    def batch(self) -> int:
        return len(self._rows)

    def reset(
        self,
        logits: np.ndarray,
        values: np.ndarray,
        legal: np.ndarray,
        rng: np.random.Generator | None = None,
    ) -> None:
        """New roots with the network's ``logits`` ``[B, A]`` and ``values`` ``[B]`` and the ``legal`` actions
        ``[B, A]`` (at least one each). ``rng``: the Gumbel draws (Gumbel) or Dirichlet noise (PUCT); None for none
        (a deterministic search: evaluation)."""
        s, legal = self.settings, np.asarray(legal, bool)
        if not legal.any(axis=1).all():
            raise ValueError("search: a root has no legal action")
        self.visits.fill(0)
        self.value_sum.fill(0.0)
        self.value.fill(0.0)
        self.reward.fill(0.0)
        self.discount.fill(1.0)
        self.parent.fill(-1)
        self.children.fill(-1)
        self.logits.fill(-np.inf)
        self.terminal.fill(False)
        prior = log_prior(logits, legal)
        if rng is not None and s.rule == "puct" and s.dirichlet_fraction > 0:
            noise = rng.dirichlet(np.full(legal.shape[1], s.dirichlet_alpha), size=legal.shape[0])
            noise = np.where(legal, noise, 0.0)
            noise /= noise.sum(axis=1, keepdims=True)
            with np.errstate(divide="ignore"):
                mixed = np.log((1 - s.dirichlet_fraction) * np.exp(prior) + s.dirichlet_fraction * noise)
            prior = np.where(legal, mixed, -np.inf)
        self.logits[:, 0] = prior
        values = np.asarray(values, np.float64)
        self.value[:, 0] = values
        self.value_sum[:, 0] = values
        self.visits[:, 0] = 1
        self.gumbel[:] = rng.gumbel(size=self.gumbel.shape) if rng is not None and s.rule != "puct" else 0.0
        self.considered[:] = np.minimum(s.considered, legal.sum(axis=1))
        self.new_node = 1

    # ------------------------------------------------------------------ one simulation
    def select(self) -> tuple[np.ndarray, np.ndarray]:
        """Descend every tree from its root to the edge it expands next: its parent nodes and actions ``[B]``
        (:attr:`parents`, :attr:`actions`). Where the descent reaches a terminal node already in the tree
        (:attr:`revisits`), that tree has nothing to evaluate: :meth:`expand` backs its terminal value up again."""
        if self.new_node >= self.visits.shape[1]:
            raise RuntimeError("search: every simulation of this search is done; reset the trees")
        node = np.zeros(self.batch, np.int64)
        self.revisits[:] = False
        active = self._rows
        depth = 0
        while len(active):
            at = node[active]
            action = self._root_actions(active) if depth == 0 else self._inner_actions(active, at)
            child = self.children[active, at, action]
            fresh = child < 0
            done = active[fresh]
            self.parents[done], self.actions[done] = at[fresh], action[fresh]
            ended = ~fresh & self.terminal[active, np.maximum(child, 0)]
            self.revisits[active[ended]] = True
            self._leaf[active[ended]] = child[ended]
            more = ~fresh & ~ended
            node[active[more]] = child[more]
            active = active[more]
            depth += 1
        return self.parents, self.actions

    def expand(
        self,
        logits: np.ndarray,
        values: np.ndarray,
        legal: np.ndarray,
        rewards: np.ndarray,
        discounts: np.ndarray,
        terminal: np.ndarray,
    ) -> None:
        """The children that :meth:`select` chose, evaluated (``[B, A]``, ``[B]``; a tree's entries where it
        revisited a terminal node are ignored): their logits, values (ignored at a terminal node, whose value is 0)
        and legal actions, the reward and discount of the move into them, whether the game ended there. Each new
        node's value (or a revisited terminal node's 0) is backed up to its root."""
        grow = ~self.revisits
        rows, new = self._rows[grow], self.new_node
        parents, actions = self.parents[grow], self.actions[grow]
        terminal = np.asarray(terminal, bool)
        self.children[rows, parents, actions] = new
        self.parent[rows, new] = parents
        self.logits[rows, new] = log_prior(np.asarray(logits)[grow], np.asarray(legal, bool)[grow])
        self.value[rows, new] = np.where(terminal, 0.0, np.asarray(values, np.float64))[grow]
        self.reward[rows, new] = np.asarray(rewards, np.float64)[grow]
        self.discount[rows, new] = np.asarray(discounts, np.float64)[grow]
        self.terminal[rows, new] = terminal[grow]
        leaf = np.where(grow, new, self._leaf)
        self._backup(leaf, np.where(grow, self.value[self._rows, new], 0.0))
        self.new_node += 1

    def _backup(self, leaf: np.ndarray, g: np.ndarray) -> None:
        """Add ``g`` (each leaf's value) to every node on each path up to the root, as seen from each node."""
        node, g = leaf.copy(), g.copy()
        self.visits[self._rows, node] += 1
        self.value_sum[self._rows, node] += g
        active = self._rows[node != 0]
        while len(active):
            at = node[active]
            g[active] = self.reward[active, at] + self.discount[active, at] * g[active]
            up = self.parent[active, at]
            node[active] = up
            self.visits[active, up] += 1
            self.value_sum[active, up] += g[active]
            active = active[up != 0]

    # ------------------------------------------------------------------ the rules
    def _children(self, rows: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The visit counts and Q values (0 where unvisited) of the actions of ``nodes`` of trees ``rows``."""
        child = self.children[rows, nodes]
        safe, r = np.maximum(child, 0), rows[:, None]
        n = np.where(child >= 0, self.visits[r, safe], 0)
        q = self.reward[r, safe] + self.discount[r, safe] * self.value_sum[r, safe] / np.maximum(n, 1)
        return n, np.where(n > 0, q, 0.0)

    def _completed(self, rows: np.ndarray, nodes: np.ndarray, n: np.ndarray, q: np.ndarray) -> np.ndarray:
        """The completed Q values: an unvisited action's is the node's mixed value (its network value and its
        visited actions' Q weighted by their prior)."""
        prior = np.exp(self.logits[rows, nodes])
        visited = n > 0
        total = n.sum(axis=1)
        mass = (prior * visited).sum(axis=1)
        weighted = (prior * q * visited).sum(axis=1) / np.maximum(mass, _EPS)
        mixed = (self.value[rows, nodes] + total * weighted) / (1.0 + total)
        return np.where(visited, q, mixed[:, None])

    def _qhat(self, rows: np.ndarray, nodes: np.ndarray, n: np.ndarray, q: np.ndarray) -> np.ndarray:
        """The completed Q values min-max normalised over the legal actions (0 for the others)."""
        completed = self._completed(rows, nodes, n, q)
        legal = np.isfinite(self.logits[rows, nodes])
        lo = np.where(legal, completed, np.inf).min(axis=1, keepdims=True)
        hi = np.where(legal, completed, -np.inf).max(axis=1, keepdims=True)
        return np.where(legal, (completed - lo) / np.maximum(hi - lo, _EPS), 0.0)

    def _sigma(self, n: np.ndarray, qhat: np.ndarray) -> np.ndarray:
        s = self.settings
        return (s.c_visit + n.max(axis=1, keepdims=True)) * s.c_scale * qhat

    def _root_actions(self, rows: np.ndarray) -> np.ndarray:
        if self.settings.rule == "puct":
            return self._puct(rows, np.zeros(len(rows), np.int64))
        root = np.zeros(len(rows), np.int64)
        n, q = self._children(rows, root)
        logits = self.logits[rows, 0]
        score = self.gumbel[rows] + logits + self._sigma(n, self._qhat(rows, root, n, q))
        want = self._schedule[self.considered[rows], self.new_node - 1]  # by the simulations done
        eligible = np.isfinite(logits) & (n == want[:, None])
        eligible |= ~eligible.any(axis=1, keepdims=True) & np.isfinite(logits)
        return np.where(eligible, score, -np.inf).argmax(axis=1)

    def _inner_actions(self, rows: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        if self.settings.rule == "puct":
            return self._puct(rows, nodes)
        n, q = self._children(rows, nodes)
        logits = self.logits[rows, nodes]
        improved = _softmax(logits + self._sigma(n, self._qhat(rows, nodes, n, q)))
        score = improved - n / (1.0 + n.sum(axis=1, keepdims=True))
        return np.where(np.isfinite(logits), score, -np.inf).argmax(axis=1)

    def _puct(self, rows: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        n, q = self._children(rows, nodes)
        logits = self.logits[rows, nodes]
        qhat = self._qhat(rows, nodes, n, q)
        explore = np.exp(logits) * np.sqrt(self.visits[rows, nodes])[:, None] / (1.0 + n)
        score = qhat + self.settings.c_puct * explore
        return np.where(np.isfinite(logits), score, -np.inf).argmax(axis=1)

    # ------------------------------------------------------------------ results
    def root_visits(self) -> np.ndarray:
        """The visit count of each root action ``[B, A]``."""
        return self._children(self._rows, np.zeros(self.batch, np.int64))[0]

    def root_value(self) -> np.ndarray:
        """The search's value of each root ``[B]``: PUCT's mean of what was backed up through it (``prior``: the
        network's value); Gumbel's the completed Q expected under the improved policy (its visits are spread by the
        schedule, not by merit, so their mean would weigh a bad action as much as the good one)."""
        if self.settings.rule != "gumbel":
            return self.value_sum[:, 0] / self.visits[:, 0]
        root = np.zeros(self.batch, np.int64)
        n, q = self._children(self._rows, root)
        completed = np.where(np.isfinite(self.logits[:, 0]), self._completed(self._rows, root, n, q), 0.0)
        return (self.policy() * completed).sum(axis=1)

    def policy(self) -> np.ndarray:
        """The policy target ``[B, A]``: Gumbel's improved policy, PUCT's visit distribution, or the prior."""
        if self.settings.rule == "prior":
            return _softmax(self.logits[:, 0])
        root = np.zeros(self.batch, np.int64)
        n, q = self._children(self._rows, root)
        if self.settings.rule == "puct":
            return n / n.sum(axis=1, keepdims=True)
        return _softmax(self.logits[:, 0] + self._sigma(n, self._qhat(self._rows, root, n, q)))

    def root_action(self) -> np.ndarray:
        """The action each search plays ``[B]``: Gumbel's best (by ``g + logits + sigma(q)``) of the most visited,
        or PUCT's most visited (the higher prior among ties), or the prior's choice (``g + logits``)."""
        if self.settings.rule == "prior":
            return (self.gumbel + self.logits[:, 0]).argmax(axis=1)
        root = np.zeros(self.batch, np.int64)
        n, q = self._children(self._rows, root)
        logits = self.logits[:, 0]
        legal = np.isfinite(logits)
        most = legal & (n == np.where(legal, n, -1).max(axis=1, keepdims=True))
        if self.settings.rule == "puct":
            score = logits
        else:
            score = self.gumbel + logits + self._sigma(n, self._qhat(self._rows, root, n, q))
        return np.where(most, score, -np.inf).argmax(axis=1)
