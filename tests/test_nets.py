"""Networks: normalizer statistics, policy sampling/log-probs, flat state shipping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from srl.nets.mlp import mlp
from srl.nets.normalizer import RunningMeanStd
from srl.nets.policy import PolicyNet, ValueNet

OBS = spaces.Box(-np.inf, np.inf, shape=(5,), dtype=np.float32)
DISCRETE = spaces.Discrete(4)
BOX = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)


def _obs(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Observations with non-trivial mean/scale so normalization matters."""
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(n, 5, generator=g) * 3.0 + 2.0}


def _fold(net: PolicyNet | ValueNet, obs: dict[str, torch.Tensor]) -> None:
    """Fold a batch into the net's own normalizers, as the trainer does after an update."""
    for rms, x in net.encoder.normalizer_inputs(obs):
        rms.update(x)


def test_running_mean_std_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    rms = RunningMeanStd((3, 2))
    seen = []
    for n in (1, 7, 100, 3, 250, 2):
        batch = rng.normal(5.0, 2.0, size=(n, 3, 2)).astype(np.float32)
        seen.append(batch)
        rms.update(torch.from_numpy(batch))
    data = np.concatenate(seen).astype(np.float64)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-4, atol=1e-4)
    assert rms.count.item() == pytest.approx(len(data), abs=1e-3)
    assert rms.mean.dtype == torch.float32 and rms.count.dtype == torch.float64


def test_running_mean_std_uint8_and_clip() -> None:
    rms = RunningMeanStd(4)
    rms.update(torch.randint(0, 256, (64, 4), dtype=torch.uint8))
    out = rms.normalize(torch.randint(0, 256, (8, 4), dtype=torch.uint8))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert rms.normalize(torch.full((1, 4), 1e9), clip=5.0).max().item() == 5.0


def test_mlp_structure() -> None:
    net = mlp(4, (8, 16), "relu", layer_norm=True)
    kinds = [type(m).__name__ for m in net]
    assert kinds == ["Linear", "LayerNorm", "ReLU", "Linear", "LayerNorm", "ReLU"]
    assert net(torch.randn(2, 4)).shape == (2, 16)
    with pytest.raises(ValueError, match="activation"):
        mlp(4, (8,), "swish", layer_norm=False)


@pytest.mark.parametrize("action_space", [DISCRETE, BOX], ids=["discrete", "box"])
def test_act_shapes_and_logp_consistency(action_space: spaces.Discrete | spaces.Box) -> None:
    torch.manual_seed(0)
    net = PolicyNet(OBS, action_space, hidden=(32, 32))
    _fold(net, _obs(100))
    obs = _obs(16, seed=1)
    actions, logp = net.act(obs)
    if isinstance(action_space, spaces.Discrete):
        assert actions.shape == (16,) and actions.dtype == torch.int64
        assert ((actions >= 0) & (actions < 4)).all()
    else:
        assert actions.shape == (16, 3) and actions.dtype == torch.float32
    assert logp.shape == (16,) and logp.dtype == torch.float32
    assert not actions.requires_grad and not logp.requires_grad
    eval_logp, entropy = net.evaluate(obs, actions)
    assert entropy.shape == (16,)
    torch.testing.assert_close(eval_logp, logp, rtol=1e-5, atol=1e-5)
    det_actions, _ = net.act(obs, deterministic=True)
    det_again, _ = net.act(obs, deterministic=True)
    torch.testing.assert_close(det_actions, det_again)


def test_discrete_sampling_frequencies_match_softmax() -> None:
    torch.manual_seed(0)
    net = PolicyNet(OBS, DISCRETE, hidden=(16,), normalize_obs=False)
    with torch.no_grad():
        net.head.weight.normal_(0.0, 1.0)  # make the distribution far from uniform
    n = 20_000
    one = _obs(1)
    actions, _ = net.act({"obs": one["obs"].expand(n, 5)})
    probs = torch.softmax(net(one), dim=-1)[0].detach().numpy()
    counts = np.bincount(actions.numpy(), minlength=4)
    chi2 = float(((counts - n * probs) ** 2 / (n * probs)).sum())
    assert chi2 < 20.0, (counts, probs)  # 3 dof: p(chi2 > 20) ~ 2e-4
    assert probs.min() < 0.15 < 0.4 < probs.max()


def test_deterministic_discrete_is_argmax_and_box_is_mean() -> None:
    obs = _obs(8)
    d_net = PolicyNet(OBS, DISCRETE)
    d_act, _ = d_net.act(obs, deterministic=True)
    torch.testing.assert_close(d_act, d_net(obs).argmax(-1))
    b_net = PolicyNet(OBS, BOX)
    b_act, _ = b_net.act(obs, deterministic=True)
    torch.testing.assert_close(b_act, b_net(obs).detach())


def test_gaussian_logp_and_entropy_match_torch_distributions() -> None:
    torch.manual_seed(0)
    net = PolicyNet(OBS, BOX)
    with torch.no_grad():
        net.dist.log_std.copy_(torch.tensor([-0.5, 0.0, 0.7]))
    obs = _obs(32)
    actions = torch.randn(32, 3) * 2.0
    logp, entropy = net.evaluate(obs, actions)
    dist = torch.distributions.Normal(net(obs), net.dist.log_std.exp())
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    sampled, act_logp = net.act(obs)
    torch.testing.assert_close(act_logp, dist.log_prob(sampled).sum(-1).detach())


def test_categorical_logp_and_entropy_match_torch_distributions() -> None:
    torch.manual_seed(0)
    net = PolicyNet(OBS, DISCRETE)
    obs = _obs(32)
    actions = torch.randint(0, 4, (32,))
    logp, entropy = net.evaluate(obs, actions)
    dist = torch.distributions.Categorical(logits=net(obs))
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())


@pytest.mark.parametrize("action_space", [DISCRETE, BOX], ids=["discrete", "box"])
def test_evaluate_has_gradients(action_space: spaces.Discrete | spaces.Box) -> None:
    net = PolicyNet(OBS, action_space, layer_norm=True)
    obs = _obs(8)
    actions, _ = net.act(obs)
    logp, entropy = net.evaluate(obs, actions)
    (logp.sum() + entropy.sum()).backward()
    assert net.head.weight.grad is not None and net.head.weight.grad.abs().sum() > 0
    if isinstance(action_space, spaces.Box):
        assert net.dist.log_std.grad is not None


ACTION_SPACES = {
    "discrete": DISCRETE,
    "box": BOX,
    "multi_discrete": spaces.MultiDiscrete([2, 5, 3]),
    "multi_discrete_equal": spaces.MultiDiscrete([3, 3]),
    "multi_binary": spaces.MultiBinary(4),
}


@pytest.mark.parametrize("name", list(ACTION_SPACES))
def test_flat_state_round_trip(name: str) -> None:
    """Every action head: the flat snapshot carries parameters and normalizer statistics, and loads exactly."""
    action_space = ACTION_SPACES[name]
    torch.manual_seed(0)
    src = PolicyNet(OBS, action_space, layer_norm=True)
    _fold(src, _obs(300))
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    flat = src.flat_state()
    assert flat.dtype == np.float32 and flat.shape == (src.flat_size(),)
    n_params = sum(p.numel() for p in src.parameters())
    assert src.flat_size() == n_params + 5 + 5 + 1  # + normalizer mean, var, count

    torch.manual_seed(123)
    dst = PolicyNet(OBS, action_space, layer_norm=True)
    flat.setflags(write=False)  # as a read-only shared-memory view would be
    obs = _obs(16, seed=7)
    assert not torch.equal(dst(obs), src(obs))
    dst.load_flat_state(flat)
    torch.testing.assert_close(dst(obs), src(obs), rtol=0, atol=0)
    assert dst.obs_normalizer is not None and src.obs_normalizer is not None
    torch.testing.assert_close(dst.obs_normalizer.mean, src.obs_normalizer.mean, rtol=0, atol=0)
    torch.testing.assert_close(dst.obs_normalizer.var, src.obs_normalizer.var, rtol=0, atol=0)
    det_src, logp_src = src.act(obs, deterministic=True)
    det_dst, logp_dst = dst.act(obs, deterministic=True)
    torch.testing.assert_close(det_dst, det_src, rtol=0, atol=0)
    torch.testing.assert_close(logp_dst, logp_src, rtol=0, atol=0)

    out = np.zeros(src.flat_size(), dtype=np.float32)
    assert src.flat_state(out) is out
    np.testing.assert_array_equal(out, flat)
    np.testing.assert_array_equal(dst.flat_state(), flat)


def test_load_flat_state_rejects_wrong_length() -> None:
    net = PolicyNet(OBS, DISCRETE)
    expected = net.flat_size()
    with pytest.raises(ValueError, match=rf"expected {expected}, got {expected - 1}"):
        net.load_flat_state(np.zeros(expected - 1, dtype=np.float32))
    with pytest.raises(ValueError, match="expected"):
        net.load_flat_state(np.zeros(expected + 3, dtype=np.float32))


def test_flat_state_without_normalizer_has_only_parameters() -> None:
    net = PolicyNet(OBS, BOX, normalize_obs=False)
    assert net.obs_normalizer is None
    assert net.flat_size() == sum(p.numel() for p in net.parameters())
    assert net.encoder.normalizer_inputs(_obs(4)) == []


def test_policy_accepts_uint8_and_multi_dim_obs() -> None:
    space = spaces.Box(0, 255, shape=(2, 3), dtype=np.uint8)
    net = PolicyNet(space, DISCRETE, hidden=(8,))
    obs = {"obs": torch.randint(0, 256, (4, 2, 3), dtype=torch.uint8)}
    _fold(net, obs)
    actions, logp = net.act(obs)
    assert actions.shape == (4,) and torch.isfinite(logp).all()


def test_value_net_shape_and_own_normalizer() -> None:
    critic = ValueNet(OBS, hidden=(32, 32), activation="elu", layer_norm=True, normalize_obs=True)
    _fold(critic, _obs(50))
    values = critic(_obs(10))
    assert values.shape == (10,) and values.dtype == torch.float32
    actor = PolicyNet(OBS, DISCRETE)
    assert actor.obs_normalizer is not None
    assert actor.obs_normalizer is not critic.obs_normalizer
    assert actor.obs_normalizer.count.item() < 1.0


def test_plane_convolutions_see_a_pattern_wherever_it_is_on_the_board():
    """``model.plane_convs``: float [C, H, W] parts go through same-padded 3x3 convolutions; shifting a pattern
    shifts the convolutions' features with it (what a flat MLP cannot give for free)."""
    from gymnasium import spaces

    from srl.nets.policy import ObsEncoder

    space = spaces.Dict({"board": spaces.Box(0.0, 1.0, (2, 13, 13), np.float32), "turn": spaces.Discrete(2)})
    enc = ObsEncoder(space, (32,), "relu", False, normalize_obs=False, plane_convs=(8, 4))
    board = torch.zeros(2, 2, 13, 13)
    board[0, 0, 4, 4:7] = 1.0  # three in a row
    board[1, 0, 6, 6:9] = 1.0  # the same, two rows down and two columns right
    features = enc.cnns["obs/board"](board)
    assert features.shape == (2, 4, 13, 13)
    # where the pattern reaches (two 3x3 layers: two squares around it), away from the board's edge
    torch.testing.assert_close(features[1, :, 4:9, 4:11], features[0, :, 2:7, 2:9])
    assert not torch.allclose(features[0, :, 2:7, 2:9], features[0, :, 6:11, 2:9])  # and it is seen only there
    out = enc({"obs.board": board, "obs.turn": torch.tensor([0, 1])})
    assert out.shape == (2, 32) and enc.out_dim == 32


def test_the_nature_cnn_in_bfloat16_keeps_float32_weights_and_follows_float32() -> None:
    """``model.cnn_dtype: bfloat16``: the same weights give float32 features and gradients within bfloat16's
    8 significant bits of the float32 CNN's; weights and gradients stay float32 (the optimizer's business)."""
    from srl.nets.cnn import NatureCNN

    torch.manual_seed(0)
    full, half = NatureCNN((4, 84, 84)), NatureCNN((4, 84, 84), "bfloat16")
    half.load_state_dict(full.state_dict())
    frames = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8)
    a, b = full(frames), half(frames)
    assert b.dtype == torch.float32 and b.shape == (16, 512)
    error = float(torch.linalg.norm(b - a) / torch.linalg.norm(a))
    assert 1e-4 < error < 0.02  # bfloat16 arithmetic (float32 would give ~1e-7), within its precision
    a.square().sum().backward()
    b.square().sum().backward()
    for p, q in zip(full.parameters(), half.parameters()):
        assert q.dtype == torch.float32 and q.grad is not None and q.grad.dtype == torch.float32
        assert torch.linalg.norm(q.grad - p.grad) / torch.linalg.norm(p.grad) < 0.02
    with pytest.raises(ValueError, match="float16"):
        NatureCNN((4, 84, 84), "float16")
