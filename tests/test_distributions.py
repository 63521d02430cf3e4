"""Action heads (srl.nets.distributions) against torch.distributions, and PolicyNet over product action spaces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from gymnasium import spaces

from srl.api.spaces import ActionSpec, action_spec
from srl.nets.distributions import Bernoulli, Categorical, DiagGaussian, MultiCategorical, make_action_head
from srl.nets.policy import PolicyNet

NVECS = [(3, 3, 3), (2, 5, 3)]
NVEC_IDS = ["equal", "unequal"]
OBS = spaces.Box(-np.inf, np.inf, shape=(5,), dtype=np.float32)


def _components(out: torch.Tensor, nvec: tuple[int, ...]) -> list[torch.distributions.Categorical]:
    """The reference: one independent torch Categorical per component, on its slice of the flat output."""
    bounds = np.cumsum((0, *nvec)).tolist()
    return [torch.distributions.Categorical(logits=out[:, lo:hi]) for lo, hi in itertools.pairwise(bounds)]


def _random_actions(n: int, nvec: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randint(0, k, (n,), generator=g) for k in nvec], dim=1)


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


# --- MultiCategorical (MultiDiscrete) ---------------------------------------------------------------------------


@pytest.mark.parametrize("nvec", NVECS, ids=NVEC_IDS)
def test_multi_categorical_evaluate_matches_sum_of_torch_categoricals(nvec: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    head = MultiCategorical(nvec)
    assert head.out_dim == sum(nvec)
    out = torch.randn(64, sum(nvec), generator=g) * 2.0
    actions = _random_actions(64, nvec, g)
    logp, entropy = head.evaluate(out, actions)
    comps = _components(out, nvec)
    ref_logp = sum(c.log_prob(actions[:, i]) for i, c in enumerate(comps))
    ref_entropy = sum(c.entropy() for c in comps)
    assert logp.shape == (64,) and entropy.shape == (64,)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(entropy, ref_entropy)


@pytest.mark.parametrize("nvec", NVECS, ids=NVEC_IDS)
def test_multi_categorical_act_logp_equals_evaluate_and_reference(nvec: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    head = MultiCategorical(nvec)
    out = torch.randn(128, sum(nvec)) * 2.0
    actions, logp = head.act(out, deterministic=False)
    assert actions.shape == (128, len(nvec)) and actions.dtype == torch.int64
    assert logp.shape == (128,) and logp.dtype == torch.float32
    for i, k in enumerate(nvec):
        assert ((actions[:, i] >= 0) & (actions[:, i] < k)).all()
    eval_logp, _ = head.evaluate(out, actions)
    torch.testing.assert_close(logp, eval_logp)
    comps = _components(out, nvec)
    torch.testing.assert_close(logp, sum(c.log_prob(actions[:, i]) for i, c in enumerate(comps)))


@pytest.mark.parametrize("nvec", NVECS, ids=NVEC_IDS)
def test_multi_categorical_deterministic_is_per_component_argmax(nvec: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(2)
    head = MultiCategorical(nvec)
    out = torch.randn(32, sum(nvec), generator=g)
    actions, logp = head.act(out, deterministic=True)
    comps = _components(out, nvec)
    expected = torch.stack([c.logits.argmax(-1) for c in comps], dim=1)
    torch.testing.assert_close(actions, expected)
    torch.testing.assert_close(logp, sum(c.log_prob(expected[:, i]) for i, c in enumerate(comps)))


@pytest.mark.parametrize("nvec", NVECS, ids=NVEC_IDS)
def test_multi_categorical_sampling_frequencies_match_softmax(nvec: tuple[int, ...]) -> None:
    torch.manual_seed(3)
    head = MultiCategorical(nvec)
    g = torch.Generator().manual_seed(4)
    one = torch.randn(1, sum(nvec), generator=g) * 1.5  # far from uniform
    n = 20_000
    actions, _ = head.act(one.expand(n, -1), deterministic=False)
    for i, comp in enumerate(_components(one, nvec)):
        probs = comp.probs[0].numpy().astype(np.float64)
        counts = np.bincount(actions[:, i].numpy(), minlength=nvec[i])
        assert counts.shape == (nvec[i],), counts  # nothing outside 0..n-1
        # at most 4 dof: p(chi2 > 30) < 5e-6
        assert _chi2(counts, probs) < 30.0, (i, counts, n * probs)


def test_multi_categorical_never_samples_padded_categories() -> None:
    """Unequal nvec pads short components to the widest; padding copies a real logit (index 0) before masking,
    so a huge first logit would make padded categories likely if the mask were missing."""
    torch.manual_seed(5)
    nvec = (2, 5, 3)
    head = MultiCategorical(nvec)
    out = torch.zeros(5000, sum(nvec))
    out[:, 0] = 30.0  # component 0 almost surely picks 0; padding of components 0 and 2 would copy this value
    for deterministic in (False, True):
        actions, logp = head.act(out, deterministic=deterministic)
        assert (actions < torch.tensor(nvec)).all(), actions.max(0)
        assert torch.isfinite(logp).all()
    # component 2 is uniform over its 3 real categories: all three appear, nothing beyond
    actions, _ = head.act(out, deterministic=False)
    assert sorted(actions[:, 2].unique().tolist()) == [0, 1, 2]
    assert sorted(actions[:, 1].unique().tolist()) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("nvec", NVECS, ids=NVEC_IDS)
def test_multi_categorical_evaluate_gradients_match_reference(nvec: tuple[int, ...]) -> None:
    """The PPO loss differentiates log-prob and entropy: gradients must be finite and equal the reference's."""
    g = torch.Generator().manual_seed(6)
    base = torch.randn(16, sum(nvec), generator=g)
    actions = _random_actions(16, nvec, g)
    out = base.clone().requires_grad_(True)
    logp, entropy = MultiCategorical(nvec).evaluate(out, actions)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    ref_out = base.clone().requires_grad_(True)
    comps = _components(ref_out, nvec)
    ref = sum(c.log_prob(actions[:, i]).sum() + 0.1 * c.entropy().sum() for i, c in enumerate(comps))
    ref.backward()
    assert out.grad is not None
    bad = (~torch.isfinite(out.grad)).any(0).nonzero().flatten().tolist()
    assert not bad, f"non-finite gradient at output columns {bad}"
    torch.testing.assert_close(out.grad, ref_out.grad)


# --- Bernoulli (MultiBinary) -------------------------------------------------------------------------------------


def test_bernoulli_logp_and_entropy_match_torch_distributions() -> None:
    g = torch.Generator().manual_seed(7)
    head = Bernoulli(6)
    out = torch.randn(64, 6, generator=g) * 3.0
    actions = (torch.rand(64, 6, generator=g) < 0.5).to(torch.int8)
    logp, entropy = head.evaluate(out, actions)
    ref = torch.distributions.Bernoulli(logits=out)
    torch.testing.assert_close(logp, ref.log_prob(actions.float()).sum(-1))
    torch.testing.assert_close(entropy, ref.entropy().sum(-1))


def test_bernoulli_act_dtype_logp_and_deterministic() -> None:
    torch.manual_seed(8)
    head = Bernoulli(6)
    out = torch.randn(64, 6) * 3.0
    actions, logp = head.act(out, deterministic=False)
    assert actions.shape == (64, 6) and actions.dtype == torch.int8
    assert set(actions.unique().tolist()) <= {0, 1}
    ref = torch.distributions.Bernoulli(logits=out)
    torch.testing.assert_close(logp, ref.log_prob(actions.float()).sum(-1))
    torch.testing.assert_close(logp, head.evaluate(out, actions)[0])
    det, det_logp = head.act(out, deterministic=True)
    assert det.dtype == torch.int8
    torch.testing.assert_close(det, (out > 0).to(torch.int8))
    torch.testing.assert_close(det_logp, ref.log_prob((out > 0).float()).sum(-1))


def test_bernoulli_sampling_frequencies_match_sigmoid() -> None:
    torch.manual_seed(9)
    logits = torch.tensor([[-2.0, -0.5, 0.0, 0.7, 2.5]])
    n = 20_000
    actions, _ = Bernoulli(5).act(logits.expand(n, -1), deterministic=False)
    p1 = torch.sigmoid(logits)[0].numpy().astype(np.float64)
    ones = actions.numpy().astype(np.int64).sum(0)
    counts = np.stack([n - ones, ones], axis=1)
    probs = np.stack([1.0 - p1, p1], axis=1)
    chi2 = sum(_chi2(c, p) for c, p in zip(counts, probs))
    assert chi2 < 30.0, (ones / n, p1)  # 5 dof: p(chi2 > 30) ~ 1.5e-5


def test_bernoulli_evaluate_gradients_match_reference() -> None:
    g = torch.Generator().manual_seed(10)
    base = torch.randn(8, 4, generator=g)
    actions = (torch.rand(8, 4, generator=g) < 0.5).to(torch.int8)
    out = base.clone().requires_grad_(True)
    logp, entropy = Bernoulli(4).evaluate(out, actions)
    (logp.sum() + entropy.sum()).backward()
    ref_out = base.clone().requires_grad_(True)
    ref = torch.distributions.Bernoulli(logits=ref_out)
    (ref.log_prob(actions.float()).sum() + ref.entropy().sum()).backward()
    torch.testing.assert_close(out.grad, ref_out.grad)


# --- make_action_head: Categorical and DiagGaussian --------------------------------------------------------------


def test_make_action_head_picks_the_head_for_each_space() -> None:
    assert isinstance(make_action_head(action_spec(spaces.Discrete(4))), Categorical)
    multi = make_action_head(action_spec(spaces.MultiDiscrete([2, 5, 3])))
    assert isinstance(multi, MultiCategorical) and multi.out_dim == 10
    binary = make_action_head(action_spec(spaces.MultiBinary(7)))
    assert isinstance(binary, Bernoulli) and binary.out_dim == 7
    gauss = make_action_head(action_spec(spaces.Box(-1, 1, (2, 3), np.float32)), init_log_std=-0.5)
    assert isinstance(gauss, DiagGaussian) and gauss.out_dim == 6
    torch.testing.assert_close(gauss.log_std.detach(), torch.full((6,), -0.5))


def test_categorical_head_matches_torch_distributions() -> None:
    torch.manual_seed(11)
    head = make_action_head(ActionSpec("discrete", (), "int64", (6,)))
    out = torch.randn(32, 6) * 2.0
    ref = torch.distributions.Categorical(logits=out)
    actions, logp = head.act(out, deterministic=False)
    assert actions.shape == (32,) and actions.dtype == torch.int64
    torch.testing.assert_close(logp, ref.log_prob(actions))
    eval_logp, entropy = head.evaluate(out, actions.reshape(32, 1))  # accepts [N, 1] as the streams may hold it
    torch.testing.assert_close(eval_logp, ref.log_prob(actions))
    torch.testing.assert_close(entropy, ref.entropy())
    det, _ = head.act(out, deterministic=True)
    torch.testing.assert_close(det, out.argmax(-1))


def test_diag_gaussian_head_matches_torch_distributions() -> None:
    torch.manual_seed(12)
    head = make_action_head(ActionSpec("box", (3,), "float32"), init_log_std=0.3)
    assert isinstance(head, DiagGaussian)
    with torch.no_grad():
        head.log_std.copy_(torch.tensor([-1.0, 0.0, 0.5]))
    out = torch.randn(32, 3)
    ref = torch.distributions.Normal(out, head.log_std.detach().exp())
    actions, logp = head.act(out, deterministic=False)
    torch.testing.assert_close(logp, ref.log_prob(actions).sum(-1))
    eval_logp, entropy = head.evaluate(out, actions)
    torch.testing.assert_close(eval_logp, ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, ref.entropy().sum(-1))
    det, det_logp = head.act(out, deterministic=True)
    torch.testing.assert_close(det, out)
    torch.testing.assert_close(det_logp, ref.log_prob(out).sum(-1))
    # sampled spread follows exp(log_std)
    many, _ = head.act(torch.zeros(20_000, 3), deterministic=False)
    torch.testing.assert_close(many.std(0), head.log_std.detach().exp(), rtol=0.03, atol=0.0)


# --- PolicyNet over MultiDiscrete and MultiBinary actions --------------------------------------------------------

PRODUCT_SPACES = {
    "multi_discrete": spaces.MultiDiscrete([2, 5, 3]),
    "multi_discrete_equal": spaces.MultiDiscrete([3, 3]),
    "multi_binary": spaces.MultiBinary(4),
}


def _obs(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(n, 5, generator=g) * 3.0 + 2.0}


def _fold(net: PolicyNet, obs: dict[str, torch.Tensor]) -> None:
    for rms, x in net.encoder.normalizer_inputs(obs):
        rms.update(x)


def _sharpen(net: PolicyNet) -> None:
    """Make the head's output far from zero, so deterministic actions and log-probs are not all alike."""
    with torch.no_grad():
        net.head.weight.normal_(0.0, 1.0)
        net.head.bias.normal_(0.0, 1.0)


@pytest.mark.parametrize("name", list(PRODUCT_SPACES))
def test_policy_net_product_actions_shapes_and_evaluate_consistency(name: str) -> None:
    space = PRODUCT_SPACES[name]
    torch.manual_seed(13)
    net = PolicyNet(OBS, space, hidden=(32, 32))
    _sharpen(net)
    _fold(net, _obs(100))
    obs = _obs(16, seed=1)
    actions, logp = net.act(obs)
    if isinstance(space, spaces.MultiDiscrete):
        assert actions.shape == (16, len(space.nvec)) and actions.dtype == torch.int64
        assert ((actions >= 0) & (actions < torch.as_tensor(space.nvec))).all()
        assert net.head.out_features == int(space.nvec.sum())
    else:
        assert actions.shape == (16, 4) and actions.dtype == torch.int8
        assert set(actions.unique().tolist()) <= {0, 1}
        assert net.head.out_features == 4
    assert logp.shape == (16,) and logp.dtype == torch.float32
    assert not actions.requires_grad and not logp.requires_grad
    # the streams hand actions back as numpy arrays of the same dtype
    as_stored = torch.from_numpy(actions.numpy().copy())
    eval_logp, entropy = net.evaluate(obs, as_stored)
    assert entropy.shape == (16,) and (entropy > 0).all()
    torch.testing.assert_close(eval_logp, logp, rtol=1e-5, atol=1e-5)
    out = net(obs).detach()
    if isinstance(space, spaces.MultiDiscrete):
        comps = _components(out, tuple(int(k) for k in space.nvec))
        torch.testing.assert_close(logp, sum(c.log_prob(actions[:, i]) for i, c in enumerate(comps)))
        det, _ = net.act(obs, deterministic=True)
        torch.testing.assert_close(det, torch.stack([c.logits.argmax(-1) for c in comps], dim=1))
    else:
        ref = torch.distributions.Bernoulli(logits=out)
        torch.testing.assert_close(logp, ref.log_prob(actions.float()).sum(-1))
        det, _ = net.act(obs, deterministic=True)
        torch.testing.assert_close(det, (out > 0).to(torch.int8))


@pytest.mark.parametrize("name", list(PRODUCT_SPACES))
def test_policy_net_product_actions_evaluate_has_finite_gradients(name: str) -> None:
    torch.manual_seed(14)
    net = PolicyNet(OBS, PRODUCT_SPACES[name], hidden=(16,))
    obs = _obs(8)
    actions, _ = net.act(obs)
    logp, entropy = net.evaluate(obs, actions)
    (logp.sum() + 0.01 * entropy.sum()).backward()
    for pname, p in net.named_parameters():
        assert p.grad is not None, pname
        finite = bool(torch.isfinite(p.grad).all())
        assert finite, f"non-finite gradient in {pname}"
    assert net.head.weight.grad.abs().sum() > 0
