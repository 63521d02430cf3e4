"""Our Adam matches torch.optim.Adam step for step, and its state round-trips."""

from __future__ import annotations

import torch

from srl.algorithms.adam import Adam


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def test_matches_torch_adam():
    ours, ref = _net(0), _net(0)
    opt = Adam(ours.parameters(), lr=3e-3, eps=1e-5)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=3e-3, eps=1e-5)
    x = torch.randn(64, 5)
    for step in range(25):
        for net, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            (net(x).pow(2).mean() + 0.1 * step).backward()
            o.step()
        if step == 10:
            opt.lr = ref_opt.param_groups[0]["lr"] = 1e-3
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_state_round_trip_continues_identically():
    a, b = _net(1), _net(1)
    opt_a = Adam(a.parameters(), lr=1e-2)
    x = torch.randn(8, 5)
    for _ in range(5):
        opt_a.zero_grad()
        a(x).sum().backward()
        opt_a.step()
    b.load_state_dict(a.state_dict())
    opt_b = Adam(b.parameters(), lr=0.5)
    opt_b.load_state_dict(opt_a.state_dict())
    for net, o in ((a, opt_a), (b, opt_b)):
        o.zero_grad()
        net(x).sum().backward()
        o.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)
