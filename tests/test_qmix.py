"""QMIX and VDN: the mixers, the double-Q targets, dead agents, and the two-step game of the QMIX paper."""

from __future__ import annotations

import pytest
import torch

from srl.algorithms.qmix_math import chosen_values, double_q, monotonic_mix, vdn_mix
from srl.nets.q import MonotonicMixer


def test_the_monotonic_mix_equals_a_plain_loop_and_never_falls_as_an_agent_value_rises():
    """``Q_tot = elu(q |w1| + b1) . |w2| + b2`` row by row; its gradient in every agent's value is >= 0 even where
    the hypernetworks' raw weights are negative."""
    torch.manual_seed(0)
    m, n, e = 5, 3, 4
    q = torch.randn(m, n, requires_grad=True)
    alive = torch.ones(m, n)
    w1, b1, w2, b2 = torch.randn(m, n, e), torch.randn(m, e), torch.randn(m, e), torch.randn(m)
    assert (w1 < 0).any() and (w2 < 0).any()
    got = monotonic_mix(q, alive, w1, b1, w2, b2)
    for r in range(m):
        hidden = []
        for j in range(e):
            x = sum(float(q[r, a]) * abs(float(w1[r, a, j])) for a in range(n)) + float(b1[r, j])
            hidden.append(x if x > 0 else float(torch.expm1(torch.tensor(x))))
        want = sum(h * abs(float(w2[r, j])) for j, h in enumerate(hidden)) + float(b2[r])
        assert float(got[r]) == pytest.approx(want, rel=1e-5, abs=1e-5)
    (grad,) = torch.autograd.grad(got.sum(), q)
    assert (grad >= 0).all() and (grad > 0).any()
    # through the hypernetwork module too, on random states
    mixer = MonotonicMixer(n, 6, embed=8, hyper=16)
    q2 = torch.randn(64, n, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(q2, torch.ones(64, n), torch.randn(64, 6), monotonic_mix).sum(), q2)
    assert (grad >= 0).all()


def test_vdn_is_the_sum_and_a_dead_agent_weighs_nothing_in_either_mix():
    torch.manual_seed(1)
    q = torch.randn(4, 3, requires_grad=True)
    alive = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(vdn_mix(q, alive), torch.stack([q[0].sum(), q[1, 0] + q[1, 2], q[2, 2], q[3, 0] * 0]))
    mixer = MonotonicMixer(3, 5, embed=4, hyper=8)
    state = torch.randn(4, 5)
    for mix in (lambda x: vdn_mix(x, alive), lambda x: mixer(x, alive, state, monotonic_mix)):
        (grad,) = torch.autograd.grad(mix(q).sum(), q)
        assert (grad[alive == 0] == 0).all()
        changed = q.detach().clone()
        changed[alive == 0] += 100.0
        torch.testing.assert_close(mix(changed), mix(q.detach()))


def test_double_q_values_each_agents_greedy_legal_online_action_by_the_target_network():
    torch.manual_seed(2)
    online, target = torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 4)
    legal = torch.rand(2, 5, 3, 4) > 0.4
    legal[..., 1] |= ~legal.any(-1)  # at least one legal action each
    got = double_q(online, target, legal)
    for t in range(2):
        for b in range(5):
            for a in range(3):
                allowed = [k for k in range(4) if legal[t, b, a, k]]
                best = max(allowed, key=lambda k: float(online[t, b, a, k]))
                assert float(got[t, b, a]) == float(target[t, b, a, best])
    actions = torch.randint(0, 4, (2, 5, 3))
    torch.testing.assert_close(chosen_values(online, actions), online.gather(-1, actions.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(double_q(online, target), chosen_values(target, online.argmax(-1)))


def _two_step_game(mixing: str) -> tuple[int, float]:
    """The QMIX paper's two-step game, learned by tabular agents from every joint action alike: in the first
    state agent 1's action chooses the next game (2A pays 7 whatever both do; 2B pays 0, 1, 1 or 8), which both
    agents see. Returns agent 1's greedy first action and the team's value of the greedy joint action there."""
    torch.manual_seed(0)
    payoff = {1: torch.full((2, 2), 7.0), 2: torch.tensor([[0.0, 1.0], [1.0, 8.0]])}
    tables = torch.nn.Parameter(torch.zeros(2, 3, 2))  # [agent, state, action]
    mixer = MonotonicMixer(2, 3, embed=8, hyper=16)
    params = [tables, *mixer.parameters()] if mixing == "qmix" else [tables]
    optimizer = torch.optim.Adam(params, lr=0.05)
    rows = torch.tensor([(s, a, b) for s in range(3) for a in range(2) for b in range(2)])
    alive = torch.ones(len(rows), 2)

    def team(states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        q = chosen_values(tables[:, states].permute(1, 0, 2), actions)
        if mixing == "vdn":
            return vdn_mix(q, alive[: len(q)])
        return mixer(q, alive[: len(q)], torch.nn.functional.one_hot(states, 3).float(), monotonic_mix)

    for _ in range(2000):
        with torch.no_grad():
            after = 1 + rows[:, 1]  # agent 1's first action picks 2A or 2B
            greedy = tables[:, after].permute(1, 0, 2).argmax(-1)
            first = team(after, greedy)
            reward = torch.stack([payoff[int(s)][a, b] if s else torch.tensor(0.0) for s, a, b in rows.tolist()])
            target = torch.where(rows[:, 0] == 0, first, reward)
        loss = (team(rows[:, 0], rows[:, 1:]) - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        start = torch.zeros(1, dtype=torch.long)
        greedy = tables[:, start].permute(1, 0, 2).argmax(-1)
        return int(greedy[0, 0]), float(team(start, greedy)[0])


def test_in_the_two_step_game_qmix_finds_the_payoff_of_8_that_vdn_cannot_represent():
    """VDN's sum fits 2B's payoffs at best as 6.5 for the joint action worth 8, below 2A's 7, so it steers to 2A;
    QMIX's monotonic mix represents 2B, values it at 8 and steers there (the QMIX paper, section 6.1)."""
    action, value = _two_step_game("vdn")
    assert action == 0 and value == pytest.approx(7.0, abs=0.1)
    action, value = _two_step_game("qmix")
    assert action == 1 and value == pytest.approx(8.0, abs=0.3)
