"""The batched search trees (srl/search/tree.py) against hand-built cases and a plain one-tree reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from srl.api.config import ConfigError, build
from srl.api.config.search import SearchConfig
from srl.search.tree import Trees, considered_visits


# --------------------------------------------------------------------------- a plain reference, one tree at a time
class _Node:
    def __init__(self, logits, legal, value, reward=0.0, discount=1.0, terminal=False):
        finite = [x for x, ok in zip(logits, legal) if ok]
        top = max(finite) if finite else 0.0
        norm = math.log(sum(math.exp(x - top) for x in finite)) if finite else 0.0
        self.prior = [x - top - norm if ok else -math.inf for x, ok in zip(logits, legal)]
        self.value = 0.0 if terminal else float(value)
        self.reward, self.discount, self.terminal = float(reward), float(discount), bool(terminal)
        self.children: dict[int, _Node] = {}
        self.n, self.w = 0, 0.0

    def q(self, a):
        c = self.children.get(a)
        return 0.0 if c is None or c.n == 0 else c.reward + c.discount * c.w / c.n

    def visits(self, a):
        c = self.children.get(a)
        return 0 if c is None else c.n

    def completed(self):
        """The completed Q of every action."""
        actions = range(len(self.prior))
        total = sum(self.visits(a) for a in actions)
        mass = sum(math.exp(self.prior[a]) for a in actions if self.visits(a) > 0)
        weighted = sum(math.exp(self.prior[a]) * self.q(a) for a in actions if self.visits(a) > 0) / max(mass, 1e-8)
        mixed = (self.value + total * weighted) / (1 + total)
        return [self.q(a) if self.visits(a) > 0 else mixed for a in actions]

    def qhat(self):
        """The completed, normalised Q of every action."""
        actions = range(len(self.prior))
        completed = self.completed()
        legal = [a for a in actions if self.prior[a] > -math.inf]
        lo, hi = min(completed[a] for a in legal), max(completed[a] for a in legal)
        return [(completed[a] - lo) / max(hi - lo, 1e-8) if a in legal else 0.0 for a in actions]

    def sigma(self, s):
        top = max(self.visits(a) for a in range(len(self.prior)))
        return [(s.c_visit + top) * s.c_scale * x for x in self.qhat()]


def _softmax(xs):
    top = max(x for x in xs if x > -math.inf)
    e = [math.exp(x - top) if x > -math.inf else 0.0 for x in xs]
    return [x / sum(e) for x in e]


def _argmax(scores):
    return max(range(len(scores)), key=lambda a: (scores[a], -a))


def _reference_search(s, evaluate, root_eval, gumbel):
    """One tree, one simulation after another, written plainly; ``evaluate(path)`` gives (logits, value, legal,
    reward, discount, terminal) of the node a path of actions leads to."""
    logits, value, legal = root_eval
    root = _Node(logits, legal, value)
    root.n, root.w = 1, float(value)
    m = min(s.considered, sum(legal))
    for k in range(s.simulations):
        node, path, trail = root, [], [root]
        while True:
            if node is root and s.rule == "gumbel":
                want = considered_visits(m, s.simulations)[k]
                sig = node.sigma(s)
                scores = [gumbel[a] + node.prior[a] + sig[a] if node.prior[a] > -math.inf and node.visits(a) == want
                          else -math.inf for a in range(len(node.prior))]  # fmt: skip
            elif s.rule == "gumbel":
                sig = node.sigma(s)
                improved = _softmax([p + x for p, x in zip(node.prior, sig)])
                total = sum(node.visits(a) for a in range(len(node.prior)))
                scores = [improved[a] - node.visits(a) / (1 + total) if node.prior[a] > -math.inf else -math.inf
                          for a in range(len(node.prior))]  # fmt: skip
            else:
                qh = node.qhat()
                scores = [qh[a] + s.c_puct * math.exp(node.prior[a]) * math.sqrt(node.n) / (1 + node.visits(a))
                          if node.prior[a] > -math.inf else -math.inf for a in range(len(node.prior))]  # fmt: skip
            a = _argmax(scores)
            path.append(a)
            if a not in node.children:
                logits, value, legal, reward, discount, terminal = evaluate(tuple(path))
                child = _Node(logits, legal, value, reward, discount, terminal)
                node.children[a] = child
                leaf, g = child, child.value
                break
            node = node.children[a]
            trail.append(node)
            if node.terminal:
                leaf, g = node, 0.0
                break
        trail.append(leaf) if trail[-1] is not leaf else None
        leaf.n += 1
        leaf.w += g
        for lower, upper in zip(reversed(trail[1:]), reversed(trail[:-1])):
            g = lower.reward + lower.discount * g
            upper.n += 1
            upper.w += g
    visits = [root.visits(a) for a in range(len(root.prior))]
    if s.rule == "puct":
        policy = [v / sum(visits) for v in visits]
        most = max(visits)
        action = _argmax([root.prior[a] if visits[a] == most and root.prior[a] > -math.inf else -math.inf
                          for a in range(len(visits))])  # fmt: skip
    else:
        sig = root.sigma(s)
        policy = _softmax([p + x for p, x in zip(root.prior, sig)])
        most = max(visits)
        action = _argmax([gumbel[a] + root.prior[a] + sig[a] if visits[a] == most and root.prior[a] > -math.inf
                          else -math.inf for a in range(len(visits))])  # fmt: skip
        completed = root.completed()
        value = sum(p * c for p, c, x in zip(policy, completed, root.prior) if x > -math.inf)
        return visits, policy, action, value
    return visits, policy, action, root.w / root.n


# --------------------------------------------------------------------------- a game of random evaluations
A = 5


def _evaluation(tree: int, path: tuple[int, ...], discount: float):
    """A fixed, pseudo-random node: its logits, value, legal actions (some masked), the move's reward and discount,
    and an end after three moves or on a move numbered 4."""
    rng = np.random.default_rng([tree, len(path), *path])
    logits = rng.normal(size=A) * 2
    legal = rng.random(A) < 0.7
    legal[rng.integers(A)] = True
    terminal = len(path) >= 3 or (len(path) > 0 and path[-1] == 4)
    reward = float(rng.normal()) if terminal else float(rng.normal() * 0.1)
    return logits, float(np.tanh(rng.normal())), legal, reward, discount, terminal


def _batched_search(s, trees_n, discount, rng):
    roots = [_evaluation(b, (), discount) for b in range(trees_n)]
    trees = Trees(trees_n, A, s)
    trees.reset(np.stack([r[0] for r in roots]), np.array([r[1] for r in roots]), np.stack([r[2] for r in roots]), rng)
    paths = [{0: ()} for _ in range(trees_n)]
    for _ in range(s.simulations):
        parents, actions = trees.select()
        evals = []
        for b in range(trees_n):
            path = (*paths[b][int(parents[b])], int(actions[b]))
            if not trees.revisits[b]:
                paths[b][trees.new_node] = path
            evals.append(_evaluation(b, path, discount))
        trees.expand(*(np.array([e[i] for e in evals]) for i in range(6)))
    return trees, roots


@pytest.mark.parametrize("rule", ["gumbel", "puct"])
@pytest.mark.parametrize("discount", [-1.0, 0.97])
def test_the_batched_trees_equal_a_one_tree_reference_on_the_same_inputs(rule, discount):
    """Six trees searched together, in step, against each searched alone by the plain reference: the same visit
    counts, policy target, action and root value, over masked actions, terminal nodes revisited, and values that
    change sides (discount -1) or are discounted."""
    s = SearchConfig(simulations=24, rule=rule, considered=4)
    trees, roots = _batched_search(s, 6, discount, np.random.default_rng(3))
    for b in range(6):
        root = (roots[b][0], roots[b][1], roots[b][2])
        visits, policy, action, value = _reference_search(
            s, lambda path, b=b: _evaluation(b, path, discount), root, trees.gumbel[b]
        )
        assert trees.root_visits()[b].tolist() == visits, b
        np.testing.assert_allclose(trees.policy()[b], policy, rtol=1e-9, atol=1e-12)
        assert trees.root_action()[b] == action
        assert trees.root_value()[b] == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert (trees.root_visits() * ~roots_legal(roots)).sum() == 0  # masked actions never visited


def roots_legal(roots) -> np.ndarray:
    return np.stack([r[2] for r in roots])


def test_sequential_halving_visits_the_considered_actions_in_phases():
    """The schedule: every considered action once per round, then the better half, down to two; one action is
    visited every time."""
    assert considered_visits(4, 8) == (0, 0, 0, 0, 1, 1, 2, 2)
    assert considered_visits(2, 5) == (0, 0, 1, 1, 2)
    assert considered_visits(1, 4) == (0, 1, 2, 3)
    sixteen = considered_visits(16, 32)
    assert sixteen[:16] == (0,) * 16 and sixteen[16:24] == (1,) * 8 and sixteen[24:] == (2, 2, 2, 2, 3, 3, 3, 3)


def _bandit(s: SearchConfig, payoffs, legal=None, rng=None) -> Trees:
    """A one-move game: every action ends it with its payoff."""
    a = len(payoffs)
    legal = np.ones((1, a), bool) if legal is None else np.asarray([legal])
    trees = Trees(1, a, s)
    trees.reset(np.zeros((1, a)), np.zeros(1), legal, rng)
    for _ in range(s.simulations):
        _, actions = trees.select()
        reward = np.array([payoffs[int(actions[0])]])
        trees.expand(np.zeros((1, a)), np.zeros(1), np.ones((1, a), bool), reward, np.ones(1), np.array([True]))
    return trees


def test_gumbel_halving_plays_the_best_arm_and_a_terminal_revisit_adds_no_node():
    """Three arms of known payoff: the first phase visits each alike, the worst is then dropped; the best is
    played and the target puts its mass there. Terminal children are revisited, never expanded again."""
    s = SearchConfig(simulations=64)
    trees = _bandit(s, [0.1, 0.5, 0.9], rng=np.random.default_rng(0))
    visits = trees.root_visits()[0]
    assert visits.sum() == 64 and sorted(visits.tolist())[0] == 10  # dropped after the first phase
    assert trees.root_action()[0] == 2 and trees.policy()[0].argmax() == 2
    assert (trees.children[0] >= 0).sum() == 3  # one node per arm: revisits add none
    assert trees.root_value()[0] == pytest.approx((trees.policy()[0] * [0.1, 0.5, 0.9]).sum())


def test_the_policy_target_is_the_prior_moved_by_the_normalised_completed_q():
    """Two of three actions visited once (Q 0 and 1), a uniform prior, a root value of 0.3: the unvisited action's
    completed Q is the mixed value (0.3 + 2 * (0 + 1) / 2) / 3 = 0.4333; normalised over [0, 1]; sigma scales by
    (c_visit + max visits) * c_scale."""
    s = SearchConfig(simulations=2)
    trees = Trees(1, 3, s)
    trees.reset(np.zeros((1, 3)), np.array([0.3]), np.ones((1, 3), bool))
    for reward in (0.0, 1.0):
        trees.select()
        trees.expand(np.zeros((1, 3)), np.zeros(1), np.ones((1, 3), bool), np.array([reward]), np.ones(1), [True])
    visits = trees.root_visits()[0]
    q = np.where(visits > 0, 0.0, (0.3 + 2 * 0.5) / 3)
    q[np.flatnonzero(visits)[1 if trees.reward[0, 2] == 1.0 else 0]] = 1.0
    expected = np.exp((50 + 1) * 0.1 * q) / np.exp((50 + 1) * 0.1 * q).sum()
    np.testing.assert_allclose(trees.policy()[0], expected)


def test_masked_actions_are_never_searched_or_targeted_whatever_their_prior():
    """An illegal action with the best payoff and the highest logit: never visited, 0 in the target, not played;
    PUCT's Dirichlet noise stays on the legal actions."""
    for rule, fraction in (("gumbel", 0.0), ("puct", 0.25)):
        s = SearchConfig(simulations=16, rule=rule, dirichlet_fraction=fraction)
        rng = np.random.default_rng(1) if fraction else None  # Gumbel draws could outweigh a payoff gap of 0.1
        trees = _bandit(s, [0.2, 0.1, 5.0, 0.3], legal=[True, True, False, True], rng=rng)
        assert trees.root_visits()[0, 2] == 0 and trees.policy()[0, 2] == 0.0 and trees.root_action()[0] != 2
        if rule == "gumbel":  # without noise it finds the best legal arm
            assert trees.root_action()[0] == 3
        assert np.isinf(trees.logits[0, 0, 2]) and np.isfinite(trees.logits[0, 0, [0, 1, 3]]).all()


def test_the_prior_rule_is_the_network_alone_its_best_legal_move_or_a_draw_from_it():
    """``prior``: no simulation; without draws the most likely legal action plays, with them each legal action
    about as often as its prior says; the target is the prior and the value the network's."""
    logits = np.log(np.array([[0.1, 0.5, 0.3, 0.1]]))
    legal = np.array([[True, False, True, True]])
    trees = Trees(1, 4, SearchConfig(rule="prior"))
    assert trees.simulations == 0
    trees.reset(logits, np.array([0.25]), legal)
    assert trees.root_action().tolist() == [2] and trees.root_value().tolist() == [0.25]
    np.testing.assert_allclose(trees.policy()[0], [0.2, 0.0, 0.6, 0.2])
    rng, counts = np.random.default_rng(0), np.zeros(4)
    for _ in range(4000):
        trees.reset(logits, np.zeros(1), legal, rng)
        counts[trees.root_action()[0]] += 1
    np.testing.assert_allclose(counts / counts.sum(), [0.2, 0.0, 0.6, 0.2], atol=0.03)


def test_a_move_good_for_the_opponent_is_avoided_when_values_change_sides():
    """Two-player, discount -1: after action 0 the opponent to move is winning (+0.9 from its view, and every
    position below agrees, each from its own player's view), after action 1 losing: the search plays 1 and backs
    the root's value as about +0.9."""
    for rule in ("gumbel", "puct"):
        s = SearchConfig(simulations=32, rule=rule)
        trees = Trees(1, 2, s)
        trees.reset(np.zeros((1, 2)), np.zeros(1), np.ones((1, 2), bool))
        first, depth = {}, {0: 0}  # node -> the root action above it, its depth
        for _ in range(s.simulations):
            parents, actions = trees.select()
            p, a = int(parents[0]), int(actions[0])
            first[trees.new_node], depth[trees.new_node] = first.get(p, a), depth[p] + 1
            sign = 0.9 if first[trees.new_node] == 0 else -0.9
            value = sign * (-1) ** (depth[trees.new_node] - 1)
            trees.expand(np.zeros((1, 2)), np.array([value]), np.ones((1, 2), bool), np.zeros(1), -np.ones(1),
                         np.zeros(1, bool))  # fmt: skip
        assert trees.root_action()[0] == 1, rule
        assert trees.root_value()[0] > 0.5, rule


def test_bad_search_settings_are_one_line():
    for kwargs, needle in (
        ({"simulations": 1}, "search.simulations: a search takes at least 2 simulations, got 1"),
        ({"rule": "uct"}, "search.rule: 'uct' is not one of gumbel, puct, prior"),
        ({"considered": 1}, "search.considered: at least 2 actions, got 1"),
        ({"dirichlet_fraction": 1.5}, "search.dirichlet_fraction: 1.5 is outside [0, 1]"),
    ):
        with pytest.raises(ConfigError, match=f"^{__import__('re').escape(needle)}$"):
            build(SearchConfig, kwargs, "search.")
    with pytest.raises(ValueError, match="a root has no legal action"):
        Trees(1, 2, SearchConfig()).reset(np.zeros((1, 2)), np.zeros(1), np.zeros((1, 2), bool))


# --------------------------------------------------------------------------- on the real game
def _tic_tac_toe(moves: list[int]):
    from srl.envs.turns import OpenSpielGame, game

    g = OpenSpielGame(game("tic_tac_toe", history=True), "tic_tac_toe")
    g.reset(0)
    for move in moves:
        g.play({g.to_move()[0]: move})
    seen = [g.observe(p) for p in range(2)]
    return {k: np.stack([o[k] for o in seen]) for k in seen[0]}


def _flat(obs):
    n = len(obs["action_mask"])
    return np.zeros((n, 9)), np.zeros(n)


@pytest.mark.parametrize("rule", ["gumbel", "puct"])
def test_a_search_on_the_real_game_wins_and_blocks_with_a_network_that_knows_nothing(rule):
    """Tic-tac-toe rebuilt from each observation's history, with a network of flat logits and zero values: the
    player to move takes the win it has, and else blocks the opponent's; the seat waiting for the opponent is not
    searched (its targets are 0)."""
    from srl.api.config import EnvConfig
    from srl.search.games import GameModel, GameSearch

    model = GameModel(EnvConfig(id="srl.envs.turns:game", kwargs={"name": "tic_tac_toe", "history": True}))
    search = GameSearch(model, SearchConfig(simulations=64, rule=rule))
    # x: 0, 1; o: 3, 4; x to move wins at 2
    win = search(_flat, _tic_tac_toe([0, 3, 1, 4]), np.random.default_rng(0))
    assert win.searched.tolist() == [True, False] and win.actions[0] == 2
    assert win.value[0] > 0.5 and win.policy[1].sum() == 0 and win.policy[0].argmax() == 2
    # x: 0, 8; o: 4, 3 (threatening 5); x to move must block at 5
    block = search(_flat, _tic_tac_toe([0, 4, 8, 3]), np.random.default_rng(0))
    assert block.searched.tolist() == [True, False] and block.actions[0] == 5
    # an evaluation's search (no rng) is the same every time
    again = [search(_flat, _tic_tac_toe([0, 4, 8, 3]), None) for _ in range(2)]
    assert np.array_equal(again[0].policy, again[1].policy) and again[0].actions[0] == 5


def test_a_game_alphazero_cannot_search_on_is_one_line():
    from srl.api.config import EnvConfig
    from srl.search.games import GameModel

    for env, needle in (
        (EnvConfig(id="CartPole-v1"), "env.id: 'CartPole-v1': AlphaZero searches on the real game"),
        (EnvConfig(id="srl.envs.turns:game", kwargs={"name": "tic_tac_toe"}), "env.kwargs.history: AlphaZero"),
        (EnvConfig(id="srl.envs.turns:game", kwargs={"name": "goofspiel", "history": True}),
         "env.kwargs.name: 'goofspiel': AlphaZero searches games of one or two players who move in turn"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match="^" + __import__("re").escape(needle)):
            GameModel(env)


def test_a_games_history_rides_in_its_observations_but_is_no_feature():
    """``history: true``: each observation carries its observer's seat and the moves so far (-1 after them);
    the encoders read neither it nor the mask."""
    from srl.envs.turns import OpenSpielGame, game
    from srl.nets.policy import ObsEncoder

    seen = _tic_tac_toe([4, 0])
    assert seen["history"].tolist() == [[0, 4, 0, *[-1] * 7], [1, 4, 0, *[-1] * 7]]
    space = OpenSpielGame(game("tic_tac_toe", history=True), "tic_tac_toe").observation_space
    assert [p.name for p in ObsEncoder(space, [16], "tanh", False, False).parts] == ["obs.observation"]


def test_srl_bench_search_reports_both_ways_and_refuses_bad_sizes_in_one_line():
    """What the report holds, not the times (benchmarks measure those)."""
    import subprocess
    import sys

    from srl.bench.search import bench_search

    (row,) = bench_search([3], simulations=4, actions=3, rule="puct", seconds=0.01)
    assert row["trees"] == 3 and row["tree_us_per_simulation_batched"] > 0 and row["leaf_eval_us_per_leaf"] > 0
    assert row["speedup"] == pytest.approx(row["tree_us_per_simulation_one_at_a_time"] / row["tree_us_per_simulation_batched"], rel=0.1)  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "bench", "search", "--trees", "0,4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--trees must be >= 1" in lines[0], proc.stderr
    # a config's own searching policy (MuZero's latent search), batched and one row at a time
    from srl.api.config import load_config
    from srl.bench.search import bench_policy_search

    (mine,) = bench_policy_search(
        load_config("configs/cartpole_muzero.yaml", ["muzero.search.simulations=3"]), [2], 0.01
    )
    assert mine["trees"] == 2 and mine["simulations"] == 3 and mine["simulations_per_s_batched"] > 0
    with pytest.raises(ConfigError, match="^--config: algorithm dqn does not act by searching$"):
        bench_policy_search(load_config("configs/cartpole_dqn.yaml"), [1], 0.01)
    with pytest.raises(ConfigError, match="^muzero.search.rule: prior plays the network alone, an evaluation's"):
        bench_policy_search(load_config("configs/cartpole_muzero.yaml", ["muzero.search.rule=prior"]), [1], 0.01)


# --------------------------------------------------------------------------- learning from search: the math
def test_the_value_transform_inverts_and_two_hot_spreads_each_value_over_its_two_integers():
    """h and its inverse round-trip over six orders of magnitude; two-hot against a plain loop (negatives, exact
    integers, values beyond the support clipped to its ends); a two-hot vector's expected point is the clipped
    value, and a prediction that puts (almost) all its mass there maps back to the value."""
    import torch

    from srl.algorithms.search_math import from_categorical, scale, two_hot, unscale

    x = torch.tensor([-1e5, -300.0, -1.5, 0.0, 0.25, 7.0, 1e5], dtype=torch.float64)
    torch.testing.assert_close(unscale(scale(x)), x, rtol=1e-9, atol=1e-9)
    assert abs(float(scale(torch.tensor(1e5)))) == pytest.approx(math.sqrt(1e5 + 1) - 1 + 100)  # squashed
    y = torch.tensor([-2.25, 0.0, 1.0, 3.5, 9.0, -9.0], dtype=torch.float64)
    support = 4
    got = two_hot(y, support)
    for row, value in zip(got.tolist(), y.tolist()):
        value = min(max(value, -support), support)
        want = [0.0] * (2 * support + 1)
        low = math.floor(value)
        want[low + support] += 1 - (value - low)
        if value != low:
            want[low + support + 1] += value - low
        assert row == pytest.approx(want)
    points = torch.arange(-support, support + 1, dtype=torch.float64)
    torch.testing.assert_close((got * points).sum(-1), y.clamp(-support, support))
    value = torch.tensor([12.0], dtype=torch.float64)
    logits = torch.log(two_hot(scale(value), 20) + 1e-12)
    torch.testing.assert_close(from_categorical(logits, 20), value, rtol=1e-6, atol=1e-6)


def test_the_losses_equal_plain_cross_entropies_and_illegal_actions_take_no_part():
    import torch

    from srl.algorithms.search_math import categorical_loss, policy_loss, scale, two_hot

    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, -3.0, 0.2]], requires_grad=True)
    target = torch.tensor([[0.2, 0.0, 0.8, 0.0], [0.0, 0.5, 0.0, 0.5]])
    legal = torch.tensor([[True, False, True, True], [True, True, False, True]])
    loss = policy_loss(logits, target, legal)
    plain = logits.detach().tolist()
    for i in range(2):
        allowed = [j for j in range(4) if legal[i, j]]
        norm = math.log(sum(math.exp(plain[i][j]) for j in allowed))
        want = -sum(float(target[i, j]) * (plain[i][j] - norm) for j in allowed)
        assert float(loss[i].detach()) == pytest.approx(want, rel=1e-6)
    loss.sum().backward()
    assert logits.grad is not None and logits.grad[0, 1] == 0 and logits.grad[1, 2] == 0
    pred = torch.randn(3, 11)
    values = torch.tensor([-2.0, 0.3, 40.0])
    plain = -(two_hot(scale(values), 5) * torch.log_softmax(pred, -1)).sum(-1)
    torch.testing.assert_close(categorical_loss(pred, values, 5), plain)


# --------------------------------------------------------------------------- AlphaZero
def _alphazero_config(tmp_path, *more: str):
    from srl.api.config import load_config

    path = tmp_path / "az.yaml"
    path.write_text(
        "algorithm: alphazero\nruntime: inline\nenv: {id: srl.envs.turns:game, kwargs: {name: tic_tac_toe, "
        "history: true}, agent_id: true}\nworkers: {actors: 1, envs_per_slot: 8, segment_length: 8}\n"
        "model: {hidden: [32], normalize_obs: false}\nalphazero: {nstep: 8, batch_size: 16, search: {simulations: 8}}\n"
        "replay: {max_size: 4000, min_size: 200}\nrun: {total_env_steps: 800, eval_episodes: 0, target_return: null}\n"
    )
    return load_config(path, list(more))


def test_alphazero_trains_from_replay_items_that_carry_each_search(tmp_path):
    """The acting policy's own step fields (the search's policy, whether it searched) ride in the replay's items
    and batches; DQN's items carry none. An inline run takes its searches, inserts and trains, its learning rate
    annealed towards 0 at the run's env-step budget."""
    from srl.api.config import load_config
    from srl.replay.role import replay_spec
    from srl.runtime.plan import make_plan
    from srl.runtime.train import train

    cfg = _alphazero_config(tmp_path, "alphazero.mirror=true", "alphazero.lr_schedule=linear")  # mirrored too
    plan = make_plan(cfg)
    spec = replay_spec(plan, 0)
    assert spec.carried == ("search_policy", "search_value", "searched")
    fields = spec.batch_fields(4)
    assert fields["search_policy"].shape == (1, 4, 9) and fields["searched"].shape == (1, 4)
    assert fields["search_value"].shape == (1, 4)
    assert replay_spec(make_plan(load_config("configs/cartpole_dqn.yaml", ["runtime=inline"])), 0).carried == ()
    summary = train(cfg, tmp_path / "run", progress=None)
    assert "error" not in summary and summary["trained_samples"] > 0, summary.get("error")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["searched_share"] for r in records if "searched_share" in r]
    assert shares and 0.35 < float(np.mean(shares)) < 0.65  # each player searches on its own moves only (about half)
    lrs = [r["lr"] for r in records if "lr" in r]
    assert len(lrs) >= 2 and lrs == sorted(lrs, reverse=True) and lrs[-1] < 0.9 * cfg.alphazero.lr
    # srl eval --set: the saved run acts with a stronger search; a setting its weights do not fit is one line
    from srl.loaded import load_policies

    _, (policy,), _ = load_policies(tmp_path / "run", ["alphazero.search.simulations=3"])
    assert policy.search.settings.simulations == 3  # type: ignore[attr-defined]
    from srl.league.match import play_match  # the network alone plays whole games (no search), as srl eval does

    alone_cfg, (alone,), _ = load_policies(tmp_path / "run", ["alphazero.search.rule=prior"])
    assert play_match(alone_cfg, alone, "random", 4, 0).games == 4
    with pytest.raises(ConfigError, match="does not fit its own config"):
        load_policies(tmp_path / "run", ["model.hidden=[7]"])


def test_alphazero_settings_and_envs_it_cannot_search_are_one_line(tmp_path):
    from srl.runtime.plan import make_plan

    with pytest.raises(ConfigError, match=r"^alphazero\.search\.simulations: a search takes at least 2"):
        _alphazero_config(tmp_path, "alphazero.search.simulations=1")
    with pytest.raises(ConfigError, match=r"^env\.kwargs\.history: AlphaZero rebuilds each position"):
        make_plan(_alphazero_config(tmp_path, "env.kwargs.history=false"))
    with pytest.raises(ConfigError, match=r"^alphazero\.nstep: 9-step returns are longer than the stored"):
        make_plan(_alphazero_config(tmp_path, "alphazero.nstep=9"))
    with pytest.raises(ConfigError, match=r"^alphazero\.search\.rule: prior plays the network alone, an evaluat"):
        make_plan(_alphazero_config(tmp_path, "alphazero.search.rule=prior"))
    with pytest.raises(ConfigError, match=r"^alphazero\.search_value_share: 1\.5 is outside \[0, 1\]$"):
        _alphazero_config(tmp_path, "alphazero.search_value_share=1.5")
    make_plan(_alphazero_config(tmp_path, "alphazero.mirror=true"))  # tic-tac-toe's cells mirror
    with pytest.raises(
        ConfigError, match=r"^alphazero\.mirror: mirroring needs board planes \[C, H, W\] .* 65 actions$"
    ):
        make_plan(_alphazero_config(tmp_path, "alphazero.mirror=true", "env.kwargs.name=othello"))


@pytest.mark.parametrize(
    ("name", "mirrored"), [("connect_four", lambda a: 6 - a), ("tic_tac_toe", lambda a: a - a % 3 + 2 - a % 3)]
)
def test_a_mirrored_position_is_the_game_played_with_mirrored_moves(name, mirrored):
    """mirror_planes / mirror_actions turn the observation and legal moves of a position into those of the game
    played with every move mirrored, as OpenSpiel plays it; a row not flipped is left as it was."""
    import pyspiel

    from srl.algorithms.search_math import mirror_actions, mirror_planes

    game = pyspiel.load_game(name)
    shape = game.observation_tensor_shape()
    rng = np.random.default_rng(3)
    for _ in range(20):
        state, twin = game.new_initial_state(), game.new_initial_state()
        for _ in range(rng.integers(1, 6)):
            move = int(rng.choice(state.legal_actions()))
            state.apply_action(move)
            twin.apply_action(mirrored(move))
        planes = torch.tensor([state.observation_tensor(), state.observation_tensor()]).reshape(2, *shape)
        flip = torch.tensor([True, False])
        out = mirror_planes(planes, flip)
        torch.testing.assert_close(out[0], torch.tensor(twin.observation_tensor()).reshape(shape))
        torch.testing.assert_close(out[1], planes[1])
        legal = torch.tensor([state.legal_actions_mask(), state.legal_actions_mask()])
        out = mirror_actions(legal, flip, shape[-1])
        assert out[0].tolist() == twin.legal_actions_mask() and out[1].tolist() == legal[1].tolist()
        policy = torch.rand(1, game.num_distinct_actions())
        twice = mirror_actions(mirror_actions(policy, flip[:1], shape[-1]), flip[:1], shape[-1])
        torch.testing.assert_close(twice, policy)
        moved = mirror_actions(torch.arange(policy.shape[1])[None], flip[:1], shape[-1])[0]
        assert all(int(moved[mirrored(a)]) == a for a in range(policy.shape[1]))  # action a's value moves to a's mirror


def test_the_value_target_mixes_the_search_value_into_searched_positions_only():
    """A searched position's target is (1 - share) x its return + share x the search's value; a position that
    was not searched (a seat waiting for the opponent) keeps its return, whatever its stored search value."""
    from srl.algorithms.search_math import value_target

    returns = torch.tensor([1.0, -1.0, 0.5, 0.0, 1.0])
    search_value = torch.tensor([0.2, 0.4, -0.6, 0.9, 7.0])
    searched = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    for share in (0.0, 0.25, 1.0):
        want = [
            (1 - share) * r + share * v if s else r
            for r, v, s in zip(returns.tolist(), search_value.tolist(), searched.tolist())
        ]
        torch.testing.assert_close(value_target(returns, search_value, searched, share), torch.tensor(want))


# --------------------------------------------------------------------------- MuZero
def test_the_unroll_targets_equal_a_plain_loop_over_each_items_episode_end():
    """Past a termination a position is absorbing (value and reward 0, counted; no policy), past a time limit
    unknown (nothing counted); before the first end everything is as stored; a later end changes nothing."""
    from srl.algorithms.search_math import unroll_targets

    rng = np.random.default_rng(4)
    k1, n = 6, 64
    values = rng.normal(size=(k1, n))
    rewards = rng.normal(size=(k1, n))
    terminated = rng.random((k1, n)) < 0.12
    truncated = rng.random((k1, n)) < 0.08
    got = unroll_targets(*(torch.as_tensor(x) for x in (values, rewards, terminated, truncated)))
    for i in range(n):
        end = None
        for k in range(k1):
            if end is None:
                want = (values[k, i], 1.0, 1.0, rewards[k, i], 1.0)
            elif end == "terminated":
                want = (0.0, 1.0, 0.0, 0.0, 1.0)
            else:
                want = (None, 0.0, 0.0, None, 0.0)
            value, value_mask, policy_mask, reward, reward_mask = want
            assert float(got.value_mask[k, i]) == value_mask and float(got.policy_mask[k, i]) == policy_mask
            if value is not None:
                assert float(got.values[k, i]) == pytest.approx(value)
            if k < k1 - 1:
                assert float(got.reward_mask[k, i]) == reward_mask
                if reward is not None:
                    assert float(got.rewards[k, i]) == pytest.approx(reward)
            if end is None and (terminated[k, i] or truncated[k, i]):
                end = "terminated" if terminated[k, i] else "truncated"
    assert got.rewards.shape == (k1 - 1, n) and got.values.shape == (k1, n)


class _TableModel:
    """A latent model that is a known MDP: the latent state is a one-hot of the state, the prior flat, values 0.
    From state 0, action 0 pays 1 and leads nowhere; action 1 pays 0 but leads to state 2, whose action 1 pays 5."""

    next_state = torch.tensor([[1, 2], [3, 3], [3, 3], [3, 3]])
    reward = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 5.0], [0.0, 0.0]])

    def initial(self, obs):
        state = obs["obs"].long()
        n = len(state)
        return torch.nn.functional.one_hot(state, 4).float(), torch.zeros(n, 2), torch.zeros(n)

    def recurrent(self, latent, actions):
        state = latent.argmax(1)
        child = self.next_state[state, actions]
        n = len(state)
        return (
            torch.nn.functional.one_hot(child, 4).float(),
            self.reward[state, actions],
            torch.zeros(n, 2),
            torch.zeros(n),
        )


@pytest.mark.parametrize("rule", ["gumbel", "puct"])
def test_a_latent_search_looks_ahead_through_the_models_dynamics(rule):
    """Searched in the model's latent states (200 simulations: PUCT's means take many to see past a node's first value
    of 0), the delayed reward (0 then 5, discounted 0.9) beats the immediate 1;
    a root whose better action is illegal plays the other; the values are the discounted rewards found."""
    from srl.search.latent import LatentSearch

    search = LatentSearch(SearchConfig(simulations=200, rule=rule), actions=2, gamma=0.9)
    obs = {"obs": torch.zeros(3)}
    legal = np.array([[True, True], [True, True], [True, False]])
    found = search(_TableModel(), obs, legal, np.random.default_rng(0))
    assert found.actions.tolist() == [1, 1, 0] and found.searched.all()
    assert (found.policy[:2, 1] > 0.5).all() and found.policy[2].tolist() == [1.0, 0.0]
    assert 1.0 < found.value[0] <= 4.5 and found.value[2] == pytest.approx(1.0, abs=0.01)
    again = search(_TableModel(), obs, legal, None)  # kept trees, reset: an evaluation's search
    assert again.actions.tolist() == [1, 1, 0]


@pytest.mark.slow
def test_muzero_learns_cartpole_by_searching_its_own_model(tmp_path):
    """MuZero under the local runtime (an actor searching, a replay, a trainer unrolling the model) lifts CartPole's
    return from a random policy's ~22 to 100 (the mean of 10 episodes, with the search's own exploration) within
    60k env steps; the stored search policies and episode ends reach the trainer."""
    from srl.api.config import load_config
    from srl.runtime.train import train

    cfg = load_config(
        "configs/cartpole_muzero.yaml",
        ["run.total_env_steps=60000", "run.target_return=100", "run.return_window=10", "run.eval_episodes=0"],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["solved"], {k: summary.get(k) for k in ("error", "env_steps", "train_return_mean")}
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("reward_loss", 0) > 0 and r.get("policy_loss", 0) > 0 for r in records)


def test_muzero_settings_it_cannot_run_with_are_one_line(tmp_path):
    from srl.api.config import load_config
    from srl.runtime.plan import make_plan

    with pytest.raises(ConfigError, match=r"^muzero\.search\.simulations: a search takes at least 2"):
        load_config("configs/cartpole_muzero.yaml", ["muzero.search.simulations=1"])
    with pytest.raises(ConfigError, match=r"^replay\.item_length: muzero unrolls its model 5 steps along each item"):
        make_plan(load_config("configs/cartpole_muzero.yaml", ["replay.item_length=4"]))
    with pytest.raises(ConfigError, match=r"^algorithm: muzero needs a Discrete action space"):
        make_plan(load_config("configs/cartpole_muzero.yaml", ["env.id=Pendulum-v1"]))
    with pytest.raises(ConfigError, match=r"^muzero\.search\.rule: prior plays the network alone, an evaluation"):
        make_plan(load_config("configs/cartpole_muzero.yaml", ["muzero.search.rule=prior"]))
    with pytest.raises(ConfigError, match=r"^muzero\.unroll: must be >= 1, got 0"):
        load_config("configs/cartpole_muzero.yaml", ["muzero.unroll=0"])


# --------------------------------------------------------------------------- reanalysis
def _muzero_config(*more: str):
    from srl.api.config import load_config

    small = ["model.hidden=[32]", "muzero.latent=16", "muzero.hidden=32", "muzero.batch_size=32"]
    small += ["muzero.search.simulations=4", "replay.min_size=200", "run.eval_episodes=0", "run.target_return=null"]
    return load_config("configs/cartpole_muzero.yaml", [*small, *more])


def test_a_refresh_message_round_trips_and_one_that_does_not_fit_the_store_is_refused():
    from srl.replay.role import replay_spec
    from srl.replay.store import ReplayStore
    from srl.replay.worker import _refreshed, refresh_message
    from srl.runtime.plan import make_plan

    store = ReplayStore.in_process(replay_spec(make_plan(_muzero_config("runtime=inline")), 0))
    keys = np.array([3, 70, 11], np.int64)
    policy = np.random.default_rng(0).random((3, 2)).astype(np.float32)
    got = _refreshed(store, refresh_message(keys, {"search_policy": policy}))
    assert got is not None and got[0].tolist() == keys.tolist()
    np.testing.assert_array_equal(got[1]["search_policy"], policy)
    meta, payload = refresh_message(keys, {"search_policy": policy})
    for bad in (
        (meta, payload[:-4]),  # short
        ({**meta, "steps": 4}, payload),  # more steps than it carries
        ({**meta, "steps": -1}, payload),
        ({**meta, "fields": ["rewards"]}, payload),  # not a field the acting policy stored
        ({**meta, "fields": ["search_policy", "search_policy"]}, payload),
        ({"steps": 3}, payload),
        ({**meta, "steps": "3"}, payload),
    ):
        assert _refreshed(store, bad) is None, bad[0]


def test_a_replays_refresh_counts_are_summed_over_its_restarts():
    """A restarted replay worker counts refreshed steps from 0 again: the run keeps what its earlier starts wrote."""
    from srl.replay.worker import ReplayReports

    reports = ReplayReports(None)  # type: ignore[arg-type]  # it reads no run facts
    base = {"replay": 0, "size": 500.0, "rejected_segments": 1}
    reports.handle("replay0", {**base, "refreshed_steps": 300, "stale_refreshes": 2, "refused_refreshes": 0}, {})
    reports.restarted("replay0")
    reports.handle("replay0", {**base, "rejected_segments": 0}, {})  # nothing refreshed yet in this start
    assert reports.summary()["replays"]["replay0"]["refreshed_steps"] == 300
    again = {**base, "rejected_segments": 2, "refreshed_steps": 40, "stale_refreshes": 1, "refused_refreshes": 0}
    reports.handle("replay0", again, {})
    stats = reports.summary()["replays"]["replay0"]
    assert (stats["refreshed_steps"], stats["stale_refreshes"], stats["rejected_segments"]) == (340, 3, 3), stats
    assert reports.record()["replay0_refreshed_steps"] == 340


@pytest.mark.slow
def test_reanalyze_workers_refresh_stored_targets_at_their_share_and_bad_settings_are_one_line(tmp_path):
    """An inline MuZero run with a reanalyze worker: it re-searches a fifth as many steps as the trainer trains on
    (each trained item is 6 steps), in batches of 64, and the replay writes every one it is sent; no worker of the
    core names it. A share outside [0, 1] and reanalysis for an algorithm that stores no search are one line."""
    from srl.api.config import load_config
    from srl.runtime.plan import make_plan
    from srl.runtime.train import train

    cfg = _muzero_config("runtime=inline", "run.total_env_steps=3000", "reanalyze.workers=1", "reanalyze.share=0.2")
    summary = train(cfg, tmp_path / "run", progress=None)
    assert "error" not in summary, summary["error"]
    done, replay = summary["reanalyze"]["reanalyzed_steps"], summary["replays"]["replay0"]
    owed = 0.2 * replay["sampled"] * 6
    assert owed - 2 * 64 <= done <= owed + 64, (done, owed)
    assert replay["refreshed_steps"] + replay["stale_refreshes"] == done and replay["refused_refreshes"] == 0
    with pytest.raises(ConfigError, match=r"^reanalyze\.share: 1\.5 is outside \[0, 1\]$"):
        _muzero_config("reanalyze.share=1.5")
    with pytest.raises(ConfigError, match=r"^reanalyze\.workers: dqn's acting policy stores no search targets"):
        make_plan(load_config("configs/cartpole_dqn.yaml", ["reanalyze.workers=1"]))
    with pytest.raises(ConfigError, match=r"^reanalyze\.workers: reanalysis re-searches steps kept in a replay"):
        make_plan(load_config("configs/cartpole_ppo.yaml", ["reanalyze.workers=1"]))
    runtime = Path("srl/runtime").glob("*.py")
    assert not [p for p in runtime if "reanalyze" in p.read_text().lower() or "muzero" in p.read_text().lower()]


@pytest.mark.slow
def test_a_reanalyze_worker_killed_with_sigkill_is_restarted_alone_and_refreshes_again(tmp_path):
    """Under the local runtime the reanalyze worker attaches to the replay's shared store; killed -9 mid-run, it is
    restarted alone (counted), attaches again and its refreshed targets keep landing; once stopped, nothing of
    the run is left (processes, shared memory, its pipe folder)."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import children_of, last_record, wait_while_running, worker_pids

    from srl.base.shm import list_segments

    run, private_tmp = tmp_path / "run", tmp_path / "tmp"
    private_tmp.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "srl.cli.main",
        "train",
        "configs/cartpole_muzero.yaml",
        "--quiet",
        "--run-dir",
        str(run),
    ]
    for setting in (
        "model.hidden=[32]", "muzero.latent=16", "muzero.hidden=32", "muzero.batch_size=32",
        "muzero.search.simulations=4", "replay.min_size=200", "run.eval_episodes=0", "run.target_return=null",
        "run.total_env_steps=10000000", "run.log_interval_seconds=0.5", "reanalyze.workers=1",
    ):  # fmt: skip
        cmd += ["--set", setting]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(private_tmp))
    )
    children: set[int] = set()

    def refreshed() -> float:
        return float(last_record(run).get("replay0_refreshed_steps", 0))

    try:
        wait_while_running(lambda: refreshed() > 0 and "reanalyze0" in worker_pids(run), proc)
        children = children_of(proc.pid)
        first = worker_pids(run)["reanalyze0"]
        os.kill(first, signal.SIGKILL)
        wait_while_running(lambda: worker_pids(run).get("reanalyze0") not in (None, first), proc)
        children |= children_of(proc.pid)
        at_restart = float(last_record(run).get("reanalyzed_steps", 0))
        wait_while_running(lambda: float(last_record(run).get("reanalyzed_steps", 0)) > at_restart + 256, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    summary = json.loads(out)
    assert summary["restarts"] == {"reanalyze0": 1}
    assert any("reanalyze0: restarted (1) after: exited with code -9" in w for w in summary["warnings"])
    assert summary["replays"]["replay0"]["refused_refreshes"] == 0
    assert not [c for c in children if Path(f"/proc/{c}").exists()]
    assert not [s for s in list_segments() if s.startswith(f"srl_{proc.pid}_")]
    assert not list(private_tmp.iterdir())


@pytest.mark.slow
def test_muzero_resumes_with_its_network_target_and_saved_replay(tmp_path):
    """A resumed MuZero run starts from its checkpoint (network, target network, optimizer) and from every item it
    saved, refills nothing, and trains on."""
    from srl.runtime.train import resume_config, train

    run = tmp_path / "run"
    cfg = _muzero_config("runtime=inline", "replay.save=true", "run.total_env_steps=3000")
    first = train(cfg, run, progress=None)
    assert "error" not in first, first["error"]
    cfg2, resume = resume_config(run, ["run.total_env_steps=5000"])
    second = train(cfg2, run, progress=None, resume=resume)
    assert not [w for w in second["warnings"] if "refills" in w], second["warnings"]
    assert second["replays"]["replay0"]["size"] > first["replays"]["replay0"]["size"] >= 200
    assert second["policy_version"] > first["policy_version"] > 0
