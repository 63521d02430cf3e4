"""DQN math checked against plain-loop references, one row and one action at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from srl.algorithms.dqn_math import (
    double_q_target,
    dueling,
    epsilon_ladder,
    linear_epsilon,
    polyak_,
    q_target,
    td_loss,
)


def _rows(seed: int, n: int = 32, a: int = 5) -> dict[str, torch.Tensor]:
    """Random next-state Q values of both nets, n-step returns, discounts with terminal zeros, a legal mask
    with at least one legal action per row."""
    g = torch.Generator().manual_seed(seed)
    legal = torch.rand(n, a, generator=g) < 0.5
    legal[torch.arange(n), torch.randint(0, a, (n,), generator=g)] = True
    discounts = torch.where(torch.rand(n, generator=g) < 0.2, 0.0, 0.99**3)
    return {
        "online": torch.randn(n, a, generator=g, dtype=torch.float64),
        "target": torch.randn(n, a, generator=g, dtype=torch.float64),
        "returns": torch.randn(n, generator=g, dtype=torch.float64),
        "discounts": discounts.double(),
        "legal": legal,
    }


def _target_reference(d: dict[str, torch.Tensor], double: bool, masked: bool) -> list[float]:
    """Loop over rows; pick the best legal action by the online (double) or target net; value it by the target."""
    out = []
    for i in range(len(d["returns"])):
        picker = d["online"][i] if double else d["target"][i]
        best, best_q = -1, -float("inf")
        for a in range(picker.shape[0]):
            if masked and not d["legal"][i, a]:
                continue
            if float(picker[a]) > best_q:
                best, best_q = a, float(picker[a])
        out.append(float(d["returns"][i]) + float(d["discounts"][i]) * float(d["target"][i, best]))
    return out


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_double_q_target_matches_reference(seed: int, masked: bool) -> None:
    d = _rows(seed)
    legal = d["legal"] if masked else None
    out = double_q_target(d["online"], d["target"], d["returns"], d["discounts"], legal)
    assert out.tolist() == pytest.approx(_target_reference(d, double=True, masked=masked))
    # The online net's pick differs from the target net's somewhere, so this is not plain DQN in disguise.
    assert out.tolist() != pytest.approx(_target_reference(d, double=False, masked=masked))


@pytest.mark.parametrize("masked", [False, True])
def test_q_target_matches_reference(masked: bool) -> None:
    d = _rows(2)
    legal = d["legal"] if masked else None
    out = q_target(d["target"], d["returns"], d["discounts"], legal)
    assert out.tolist() == pytest.approx(_target_reference(d, double=False, masked=masked))


def test_mask_never_picks_an_illegal_action() -> None:
    """The best Q values sit on illegal actions: the targets must ignore them."""
    q = torch.tensor([[10.0, 1.0, 2.0], [5.0, 9.0, -1.0]])
    legal = torch.tensor([[False, True, True], [True, False, False]])
    ones = torch.ones(2)
    assert q_target(q, torch.zeros(2), ones, legal).tolist() == [2.0, 5.0]
    assert double_q_target(q, q * 2, torch.zeros(2), ones, legal).tolist() == [4.0, 10.0]


def test_terminal_row_without_legal_actions_is_not_read() -> None:
    """A terminal next observation may offer no move (and hold -inf Q values); with discount 0 it is unused."""
    q = torch.tensor([[1.0, 2.0], [float("-inf"), float("nan")]])
    legal = torch.tensor([[True, True], [False, False]])
    out = double_q_target(q, q, torch.tensor([0.5, 3.0]), torch.tensor([0.9, 0.0]), legal)
    assert out.tolist() == pytest.approx([0.5 + 0.9 * 2.0, 3.0])


def test_bootstrapping_row_without_legal_actions_is_an_error() -> None:
    legal = torch.tensor([[True, False], [False, False], [False, False]])
    with pytest.raises(ValueError, match=r"rows \[1\] bootstrap from an observation with no legal action") as info:
        q_target(torch.zeros(3, 2), torch.zeros(3), torch.tensor([1.0, 1.0, 0.0]), legal)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: q_target(torch.zeros(3, 2), torch.zeros(3, 1), torch.zeros(3)), r"returns and discounts \[N\]"),
        (lambda: q_target(torch.zeros(3, 2), torch.zeros(3), torch.zeros(3), torch.ones(3, 3)), r"mask \(3, 3\)"),
        (
            lambda: double_q_target(torch.zeros(3, 2), torch.zeros(3, 3), torch.zeros(3), torch.zeros(3)),
            r"online \(3, 2\) and target \(3, 3\)",
        ),
        (lambda: dueling(torch.zeros(3), torch.zeros(3, 2)), r"value must be \[N, 1\]"),
        (lambda: td_loss(torch.zeros(3), torch.zeros(3, 1)), r"q_taken \(3,\) and target \(3, 1\)"),
        (lambda: td_loss(torch.zeros(3), torch.zeros(3), torch.ones(3, 1)), r"weights \(3, 1\) must have q_taken's"),
        (lambda: td_loss(torch.zeros(3), torch.zeros(3), kind="l1"), r"kind='l1' must be 'huber' or 'mse'"),
        (lambda: td_loss(torch.zeros(3), torch.zeros(3), huber_delta=0.0), r"huber_delta=0.0 must be > 0"),
        (lambda: polyak_([torch.zeros(2)], [torch.zeros(2)], 0.0), r"tau=0.0 must be in \(0, 1\]"),
        (lambda: polyak_([torch.zeros(2)], [torch.zeros(2)], 1.5), r"tau=1.5"),
        (lambda: polyak_([torch.zeros(2)], [], 0.5), r"1 target tensors for 0 online"),
        (lambda: polyak_([torch.zeros(2)], [torch.zeros(3)], 0.5), r"tensor 0 has target shape \(2,\), online \(3,\)"),
        (lambda: epsilon_ladder(0), r"num_envs_total=0 must be an integer >= 1"),
        (lambda: epsilon_ladder(4, base=1.2), r"base=1.2 must be in \[0, 1\]"),
        (lambda: epsilon_ladder(4, alpha=-1.0), r"alpha=-1.0 must be >= 0"),
        (lambda: linear_epsilon(0, 1.5, 0.1, 10), r"start=1.5"),
        (lambda: linear_epsilon(-1, 1.0, 0.1, 10), r"step=-1"),
        (lambda: linear_epsilon(0, 1.0, 0.1, -5), r"decay_steps=-5"),
    ],
)
def test_bad_input_one_line(call: object, match: str) -> None:
    assert callable(call)
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)


def test_dueling_matches_reference() -> None:
    value, adv = torch.randn(6, 1, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    q = dueling(value, adv)
    for i in range(6):
        mean = sum(float(adv[i, a]) for a in range(4)) / 4
        for a in range(4):
            assert float(q[i, a]) == pytest.approx(float(value[i, 0]) + float(adv[i, a]) - mean)
    # The value is each row's mean Q, and the advantages keep their order.
    assert torch.allclose(q.mean(dim=1, keepdim=True), value)
    assert torch.equal(q.argmax(dim=1), adv.argmax(dim=1))


def _td_reference(q: list[float], target: list[float], w: list[float], kind: str, delta: float) -> float:
    """Weighted mean of per-item losses, each written out by cases."""
    total = 0.0
    for qi, ti, wi in zip(q, target, w):
        x = ti - qi
        if kind == "mse":
            loss = x * x
        elif abs(x) <= delta:
            loss = 0.5 * x * x
        else:
            loss = delta * (abs(x) - 0.5 * delta)
        total += wi * loss
    return total / len(q)


@pytest.mark.parametrize(("kind", "delta"), [("huber", 1.0), ("huber", 0.3), ("mse", 1.0)])
@pytest.mark.parametrize("weighted", [False, True])
def test_td_loss_matches_reference(kind: str, delta: float, weighted: bool) -> None:
    g = torch.Generator().manual_seed(3)
    q = (2 * torch.randn(40, generator=g, dtype=torch.float64)).requires_grad_()
    target = torch.randn(40, generator=g, dtype=torch.float64)
    weights = torch.rand(40, generator=g, dtype=torch.float64) if weighted else None
    loss, td = td_loss(q, target, weights, kind=kind, huber_delta=delta)
    w = weights.tolist() if weights is not None else [1.0] * 40
    assert loss.item() == pytest.approx(_td_reference(q.tolist(), target.tolist(), w, kind, delta), rel=1e-12)
    assert not td.requires_grad and td.tolist() == pytest.approx((target - q).tolist())
    assert ((target - q).abs() > 1.0).any() and ((target - q).abs() < 0.3).any()  # both Huber branches taken
    loss.backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


def test_td_loss_does_not_differentiate_through_target_or_weights() -> None:
    q = torch.randn(8, requires_grad=True)
    target, weights = torch.randn(8, requires_grad=True), torch.rand(8, requires_grad=True)
    loss, _ = td_loss(q, target, weights)
    loss.backward()
    assert target.grad is None and weights.grad is None and q.grad is not None


def test_huber_with_delta_one_is_smooth_l1() -> None:
    """With delta = beta = 1 the two agree exactly (Huber scales smooth L1 by delta otherwise)."""
    q, target = 3 * torch.randn(100), torch.randn(100)
    loss, _ = td_loss(q, target, kind="huber", huber_delta=1.0)
    assert loss.item() == pytest.approx(F.smooth_l1_loss(q, target, beta=1.0).item(), rel=1e-6)
    assert td_loss(q, target, kind="mse")[0].item() == pytest.approx(F.mse_loss(q, target).item(), rel=1e-6)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.001, 1.0), st.integers(0, 2**16))
def test_polyak_matches_reference(tau: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    target = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
    online = [torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(5, generator=g)]
    before = [t.clone() for t in target]
    polyak_(target, online, tau)
    for t, b, o in zip(target, before, online):
        for new, old, src in zip(t.flatten().tolist(), b.flatten().tolist(), o.flatten().tolist()):
            assert new == pytest.approx((1 - tau) * old + tau * src, abs=1e-6)
    assert all(not t.requires_grad for t in target)


def test_polyak_tau_one_is_an_exact_copy_of_module_parameters() -> None:
    online, target = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    polyak_(target.parameters(), online.parameters(), 1.0)
    for t, o in zip(target.parameters(), online.parameters()):
        assert torch.equal(t, o) and t.data_ptr() != o.data_ptr()


def test_epsilon_ladder_ends_and_order() -> None:
    eps = epsilon_ladder(32 * 40)
    assert eps.shape == (1280,) and eps.dtype == np.float64
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert (np.diff(eps) < 0).all()
    for i in (1, 17, 640):  # the formula, one env at a time
        assert eps[i] == pytest.approx(0.4 ** (1 + 7 * i / 1279))
    assert epsilon_ladder(1).tolist() == [0.4]
    assert epsilon_ladder(2, base=0.5, alpha=1.0).tolist() == pytest.approx([0.5, 0.25])


def test_linear_epsilon() -> None:
    assert linear_epsilon(0, 1.0, 0.05, 100) == 1.0
    assert linear_epsilon(50, 1.0, 0.05, 100) == pytest.approx(0.525)
    assert linear_epsilon(100, 1.0, 0.05, 100) == pytest.approx(0.05)
    assert linear_epsilon(10**6, 1.0, 0.05, 100) == pytest.approx(0.05)
    assert linear_epsilon(0, 1.0, 0.05, 0) == pytest.approx(0.05)
    steps = [linear_epsilon(s, 1.0, 0.05, 100) for s in range(0, 150, 7)]
    assert (np.diff(steps) <= 0).all()
