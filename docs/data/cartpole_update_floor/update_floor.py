"""CartPole's PPO update (configs/cartpole_ppo.yaml: 512 samples, 10 epochs x 2 minibatches, one thread) in srl
against a lean loop of the same math written straight in torch: the same two 64x64 tanh MLPs, PPO's clipped loss,
a value loss, global-norm clipping and a multi-tensor Adam, without observation normalization, value clipping or
statistics. Prints the median of 30 calls of each.

    python docs/data/cartpole_update_floor/update_floor.py
"""

import time

import numpy as np
import torch
from srl.api.config import load_config
from srl.bench.throughput import random_batch
from srl.runtime.plan import make_plan
from srl.wiring import make_algorithm

torch.set_num_threads(1)
cfg = load_config("configs/cartpole_ppo.yaml", [])
plan = make_plan(cfg)
one = plan.only("update_floor.py")
algo = make_algorithm(one.obs_space, one.action_space, cfg, cfg.seed, state_space=one.state_space)
rng = np.random.default_rng(0)
batch = random_batch(one, rng, cfg.workers.batch_segments * one.columns_per_slot)
for _ in range(5):
    algo.train(batch, 0.0)
ts = []
for _ in range(30):
    t = time.perf_counter()
    algo.train(batch, 0.0)
    ts.append(time.perf_counter() - t)
print("srl train() ms median", round(1000 * np.median(ts), 2), "samples", batch["rewards"].size)
# the lean loop: the same network sizes and loss, multi-tensor Adam
obs = torch.randn(512, 4)
act = torch.randint(0, 2, (512,))
oldlp = torch.full((512,), -0.69)
adv = torch.randn(512)
ret = torch.randn(512)


def mlp(o):
    return torch.nn.Sequential(
        torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, o)
    )


pi, v = mlp(2), mlp(1)
params = list(pi.parameters()) + list(v.parameters())
m = [torch.zeros_like(p) for p in params]
s2 = [torch.zeros_like(p) for p in params]


def step(idx):
    o = obs[idx]
    lp = torch.log_softmax(pi(o), -1)
    nl = lp.gather(1, act[idx, None]).squeeze(1)
    ent = -(lp.exp() * lp).sum(-1).mean()
    r = (nl - oldlp[idx]).exp()
    a = adv[idx]
    a = (a - a.mean()) / (a.std() + 1e-8)
    pl = -torch.min(r * a, r.clamp(0.8, 1.2) * a).mean()
    vl = 0.5 * (v(o).squeeze(1) - ret[idx]).pow(2).mean()
    loss = pl + 0.5 * vl - 0.0 * ent
    for p in params:
        p.grad = None
    loss.backward()
    g = [p.grad for p in params]
    n = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(g)))
    torch._foreach_mul_(g, (0.5 / (n + 1e-6)).clamp(max=1.0))
    with torch.no_grad():
        torch._foreach_lerp_(m, g, 0.1)
        torch._foreach_mul_(s2, 0.999)
        torch._foreach_addcmul_(s2, g, g, value=0.001)
        d = torch._foreach_sqrt(s2)
        torch._foreach_add_(d, 1e-8)
        torch._foreach_addcdiv_(params, m, d, value=-1e-3)
    return float(pl.detach()), float(vl.detach())


def lean():
    for _ in range(10):
        perm = torch.randperm(512)
        for st in range(0, 512, 256):
            step(perm[st : st + 256])


for _ in range(5):
    lean()
ts = []
for _ in range(30):
    t = time.perf_counter()
    lean()
    ts.append(time.perf_counter() - t)
print("lean 20 steps ms median", round(1000 * np.median(ts), 2))
