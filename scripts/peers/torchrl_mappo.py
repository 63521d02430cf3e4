#!/usr/bin/env python
"""Peer baseline: TorchRL MAPPO, set up like TorchRL's multi-agent PPO tutorial.

This is an independent re-implementation that follows the structure and the
hyper-parameters of TorchRL's tutorial "Multi-Agent Reinforcement Learning
(PPO) with TorchRL" (VMAS navigation).  It is NOT part of srl; it exists only
to produce side-by-side numbers (throughput and learning curve).

Usage::

    python scripts/peers/torchrl_mappo.py --env vmas_navigation --frames 60000 \\
        --seed 0 --out results.json
    python scripts/peers/torchrl_mappo.py --env mpe_spread --frames 60000 \\
        --seed 0 --out results.json

Settings (tutorial values, all overridable from the command line)
-----------------------------------------------------------------
frames_per_batch 6000, num_epochs 30, minibatch_size 400 (so 15 minibatches
per epoch, 450 gradient steps per iteration), Adam lr 3e-4, max_grad_norm 1.0,
PPO clip 0.2, gamma 0.99, GAE lambda 0.9, entropy coefficient 1e-4,
normalize_advantage False, critic loss = ClipPPOLoss default (smooth L1,
coefficient 1.0).  Policy and critic are ``MultiAgentMLP`` with depth 2,
256 cells, Tanh, parameters shared across agents.  The critic is centralised
(it sees the concatenated observations of all agents) -> MAPPO.  The number of
iterations is ``ceil(--frames / frames_per_batch)``; the script therefore always
trains on whole batches and reports the frames actually collected.

Environments
------------
``vmas_navigation``: torchrl ``VmasEnv(scenario="navigation", n_agents=3,
    continuous_actions=True, max_steps=100)`` with
    ``num_envs = frames_per_batch // max_steps`` (= 60) vectorised envs, as in
    the tutorial.  Policy: ``TanhNormal`` over the 2-d force action,
    bounded by the action spec.  VMAS navigation's default
    ``shared_rew=True``: every agent receives the same (team) reward.
``mpe_spread``: ``mpe2.simple_spread_v3.parallel_env(N=3, max_cycles=25,
    continuous_actions=False)`` (other arguments left at their defaults, so
    ``local_ratio=0.5``: each agent's reward is 0.5 * global + 0.5 * its own
    collision penalty) wrapped by torchrl's ``PettingZooWrapper`` (parallel
    API, ``categorical_actions=True``, agents grouped under ``"agent"``).
    Several wrapper instances are batched with torchrl's ``SerialEnv`` (same
    process, stepped one after another; ``--spread-backend parallel`` uses
    ``ParallelEnv``, one worker process per env, instead).  By default the
    number of envs follows the tutorial's rule,
    ``num_envs = frames_per_batch // max_cycles`` (= 240; with
    ``--spread-backend parallel`` the default is ``os.cpu_count()`` instead,
    as each env is a process); ``--num-envs`` overrides it.  Each env contributes ``frames_per_batch // num_envs``
    consecutive steps per batch; episodes run on across batch boundaries
    (the collector does not reset at each iteration).  Policy: categorical
    over the 5 discrete actions (logits from the shared MLP).

Frame counting
--------------
One frame = one environment step of the whole team, however many agents act
in it (this is how the torchrl collector counts: a batch of
``frames_per_batch`` frames has batch shape ``[num_envs, T]`` with
``num_envs * T = frames_per_batch``, the agent dimension is not counted).
With PettingZoo's parallel API one ``env.step(actions_dict)`` is one frame.

Timing
------
``train_seconds`` is wall-clock time from the first request to the collector
until the last optimiser step: collection (env stepping + policy inference)
plus the PPO update (GAE + epochs).  Imports, environment and network
construction and the collector's initial reset are excluded.
``frames_per_second = total_frames / train_seconds``.

Reward reported in the curve
----------------------------
Each entry of ``curve`` is ``[frames_so_far, train_seconds_so_far,
mean_episode_reward_per_agent]`` for one iteration.  The reward is the one the
tutorial logs: a ``RewardSum`` transform accumulates, for every agent
separately, the undiscounted sum of that agent's rewards over its episode;
at every step where an episode ends (``("next", group, "done")``) the
per-agent sums are taken, and the value is the mean over all (finished
episode, agent) pairs in that batch.  In other words: the average of each
agent's episode return, over agents and over episodes that finished during
that iteration (NOT the team sum; multiply by ``n_agents`` for that).  If no
episode finished during an iteration the value is ``null``.  On VMAS
navigation (shared reward) all agents' returns are equal; on simple_spread
they differ only by the local collision terms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from functools import partial


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", required=True, choices=["vmas_navigation", "mpe_spread"])
    p.add_argument("--frames", type=int, required=True, help="frames to train for (rounded up to whole batches)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    # tutorial hyper-parameters
    p.add_argument("--frames-per-batch", type=int, default=6000)
    p.add_argument("--num-epochs", type=int, default=30)
    p.add_argument("--minibatch-size", type=int, default=400)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--clip-epsilon", type=float, default=0.2)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lmbda", type=float, default=0.9)
    p.add_argument("--entropy-eps", type=float, default=1e-4)
    p.add_argument("--n-agents", type=int, default=3)
    p.add_argument(
        "--max-steps", type=int, default=None, help="episode length: default 100 (vmas) / 25 (spread max_cycles)"
    )
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--num-cells", type=int, default=256)
    p.add_argument("--ippo", action="store_true", help="decentralised critic (IPPO) instead of MAPPO")
    # env batching
    p.add_argument(
        "--num-envs",
        type=int,
        default=None,
        help="default frames_per_batch // max_steps (tutorial rule); cpu_count for --spread-backend parallel",
    )
    p.add_argument(
        "--spread-backend",
        choices=["serial", "parallel"],
        default="serial",
        help="mpe_spread only: SerialEnv (one process) or ParallelEnv",
    )
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- envs
def _make_spread(n_agents: int, max_cycles: int):
    # module-level so that ParallelEnv can pickle it
    from mpe2 import simple_spread_v3
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    pz_env = simple_spread_v3.parallel_env(N=n_agents, max_cycles=max_cycles, continuous_actions=False)
    return PettingZooWrapper(env=pz_env, categorical_actions=True)


def build_env(args, max_steps: int, num_envs: int):
    from torchrl.envs import ParallelEnv, SerialEnv

    if args.env == "vmas_navigation":
        from torchrl.envs.libs.vmas import VmasEnv

        env = VmasEnv(
            scenario="navigation",
            num_envs=num_envs,
            continuous_actions=True,
            max_steps=max_steps,
            device="cpu",
            n_agents=args.n_agents,
            seed=args.seed,
        )
        desc = f"VmasEnv(navigation) num_envs={num_envs}"
    else:
        fn = partial(_make_spread, args.n_agents, max_steps)
        if num_envs == 1:
            env = fn()
            desc = "PettingZooWrapper(simple_spread_v3 parallel) x1"
        elif args.spread_backend == "serial":
            env = SerialEnv(num_envs, fn)
            desc = f"SerialEnv({num_envs} x PettingZooWrapper(simple_spread_v3 parallel))"
        else:
            env = ParallelEnv(num_envs, fn, num_threads=1)
            desc = f"ParallelEnv({num_envs} x PettingZooWrapper(simple_spread_v3 parallel))"
        env.set_seed(args.seed)
    return env, desc


# ----------------------------------------------------------------------- networks
def build_actor_critic(env, args, group: str, continuous: bool):
    import torch
    from tensordict.nn import TensorDictModule
    from tensordict.nn.distributions import NormalParamExtractor
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal

    obs_dim = env.observation_spec[group, "observation"].shape[-1]
    act_spec = env.full_action_spec_unbatched[env.action_key]
    n_agents = env.observation_spec[group, "observation"].shape[-2]

    def mlp(n_out: int, centralised: bool):
        return MultiAgentMLP(
            n_agent_inputs=obs_dim,
            n_agent_outputs=n_out,
            n_agents=n_agents,
            centralised=centralised,
            share_params=True,
            device="cpu",
            depth=args.depth,
            num_cells=args.num_cells,
            activation_class=torch.nn.Tanh,
        )

    if continuous:
        act_dim = act_spec.shape[-1]
        net = torch.nn.Sequential(mlp(2 * act_dim, False), NormalParamExtractor())
        head = TensorDictModule(
            net,
            in_keys=[(group, "observation")],
            out_keys=[(group, "loc"), (group, "scale")],
        )
        actor = ProbabilisticActor(
            module=head,
            spec=act_spec,
            in_keys=[(group, "loc"), (group, "scale")],
            out_keys=[env.action_key],
            distribution_class=TanhNormal,
            distribution_kwargs={"low": act_spec.space.low, "high": act_spec.space.high},
            return_log_prob=True,
        )
    else:
        n_actions = act_spec.space.n
        head = TensorDictModule(
            mlp(n_actions, False),
            in_keys=[(group, "observation")],
            out_keys=[(group, "logits")],
        )
        actor = ProbabilisticActor(
            module=head,
            spec=act_spec,
            in_keys={"logits": (group, "logits")},
            out_keys=[env.action_key],
            distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
        )

    critic = TensorDictModule(
        mlp(1, not args.ippo),
        in_keys=[(group, "observation")],
        out_keys=[(group, "state_value")],
    )
    return actor, critic, n_agents


# --------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))

    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    import tensordict
    import torchrl
    from torchrl.collectors import Collector
    from torchrl.data.replay_buffers import ReplayBuffer
    from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
    from torchrl.data.replay_buffers.storages import LazyTensorStorage
    from torchrl.envs import RewardSum, TransformedEnv
    from torchrl.objectives import ClipPPOLoss, ValueEstimators

    continuous = args.env == "vmas_navigation"
    max_steps = args.max_steps or (100 if continuous else 25)
    fpb = args.frames_per_batch
    if args.num_envs:
        num_envs = args.num_envs
    elif args.env == "mpe_spread" and args.spread_backend == "parallel":
        num_envs = os.cpu_count() or 1  # one worker process per env: keep it small
    else:
        num_envs = max(1, fpb // max_steps)
    if fpb % num_envs:
        sys.exit(f"frames_per_batch {fpb} is not a multiple of num_envs {num_envs}")
    n_iters = max(1, math.ceil(args.frames / fpb))
    total_frames = n_iters * fpb

    # ---- setup (not timed)
    t_setup = time.perf_counter()
    base_env, env_desc = build_env(args, max_steps, num_envs)
    group = base_env.reward_key[0]  # "agents" (VMAS) / "agent" (PettingZoo)
    env = TransformedEnv(
        base_env,
        RewardSum(in_keys=[base_env.reward_key], out_keys=[(group, "episode_reward")]),
    )
    actor, critic, n_agents = build_actor_critic(env, args, group, continuous)

    collector = Collector(
        env,
        actor,
        device="cpu",
        storing_device="cpu",
        frames_per_batch=fpb,
        total_frames=total_frames,
        # the tutorial's env has no InitTracker; the policy is not recurrent
        auto_register_policy_transforms=False,
    )
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(fpb, device="cpu"),
        sampler=SamplerWithoutReplacement(),
        batch_size=args.minibatch_size,
    )
    loss_module = ClipPPOLoss(
        actor_network=actor,
        critic_network=critic,
        clip_epsilon=args.clip_epsilon,
        entropy_coeff=args.entropy_eps,
        normalize_advantage=False,
    )
    loss_module.set_keys(
        reward=env.reward_key,
        action=env.action_key,
        value=(group, "state_value"),
        done=(group, "done"),
        terminated=(group, "terminated"),
    )
    loss_module.make_value_estimator(ValueEstimators.GAE, gamma=args.gamma, lmbda=args.lmbda)
    gae = loss_module.value_estimator
    optim = torch.optim.Adam(loss_module.parameters(), args.lr)
    setup_seconds = time.perf_counter() - t_setup
    n_minibatches = fpb // args.minibatch_size
    log(
        f"[torchrl_mappo] {env_desc}; group={group!r} n_agents={n_agents}; "
        f"{n_iters} iters x {fpb} frames; setup {setup_seconds:.1f}s"
    )

    # ---- training (timed)
    curve, iters = [], []
    frames = 0
    collect_s = update_s = 0.0
    t0 = time.perf_counter()
    t_mark = t0
    for it, data in enumerate(collector):
        t_collected = time.perf_counter()
        frames += data.numel()

        # per-agent done/terminated: take the group entry when the env provides
        # one, otherwise broadcast the env-level flag to every agent.
        rew_shape = data.get_item_shape(("next", env.reward_key))
        for k in ("done", "terminated"):
            if (group, k) not in data.get("next").keys(include_nested=True):
                data.set(("next", group, k), data.get(("next", k)).unsqueeze(-1).expand(rew_shape))

        with torch.no_grad():
            gae(
                data,
                params=loss_module.critic_network_params,
                target_params=loss_module.target_critic_network_params,
            )
        buffer.extend(data.reshape(-1))
        for _ in range(args.num_epochs):
            for _ in range(n_minibatches):
                sub = buffer.sample()
                lv = loss_module(sub)
                loss = lv["loss_objective"] + lv["loss_critic"] + lv["loss_entropy"]
                loss.backward()
                torch.nn.utils.clip_grad_norm_(loss_module.parameters(), args.max_grad_norm)
                optim.step()
                optim.zero_grad()
        collector.update_policy_weights_()
        t_end = time.perf_counter()
        collect_s += t_collected - t_mark
        update_s += t_end - t_collected
        elapsed = t_end - t0

        done = data.get(("next", group, "done"))
        ep_rew = data.get(("next", group, "episode_reward"))[done]
        n_eps = int(done.any(-2).sum().item()) if done.ndim >= 2 else int(done.sum())
        reward = float(ep_rew.mean().item()) if ep_rew.numel() else None
        curve.append([frames, round(elapsed, 4), reward])
        iters.append(
            {
                "iteration": it,
                "frames": frames,
                "train_seconds": round(elapsed, 4),
                "collect_seconds": round(t_collected - t_mark, 4),
                "update_seconds": round(t_end - t_collected, 4),
                "episodes_finished": n_eps,
                "mean_episode_reward_per_agent": reward,
                "loss_objective": float(lv["loss_objective"].detach()),
                "loss_critic": float(lv["loss_critic"].detach()),
            }
        )
        log(
            f"iter {it:3d} frames {frames:8d} t {elapsed:8.1f}s "
            f"fps {frames / elapsed:7.1f} eps {n_eps:4d} reward/agent "
            f"{'nan' if reward is None else f'{reward:.4f}'}"
        )
        t_mark = time.perf_counter()
    train_seconds = time.perf_counter() - t0
    collector.shutdown()
    if not env.is_closed:
        env.close()

    import mpe2  # noqa: F401  (only for the version below)
    import vmas

    result = {
        "peer": "torchrl_mappo",
        "algorithm": "IPPO" if args.ippo else "MAPPO",
        "env": args.env,
        "env_impl": env_desc,
        "seed": args.seed,
        "threads": args.threads,
        "n_agents": n_agents,
        "frames_requested": args.frames,
        "total_frames": frames,
        "train_seconds": round(train_seconds, 4),
        "collect_seconds": round(collect_s, 4),
        "update_seconds": round(update_s, 4),
        "setup_seconds": round(setup_seconds, 4),
        "frames_per_second": round(frames / train_seconds, 3),
        "final_mean_episode_reward_per_agent": curve[-1][2] if curve else None,
        "reward_convention": "mean over (finished episode, agent) of each agent's "
        "undiscounted episode return, per iteration",
        "frame_convention": "one frame = one team env step (agents not counted)",
        "curve_columns": ["frames", "train_seconds", "mean_episode_reward_per_agent"],
        "curve": curve,
        "iterations": iters,
        "config": {
            "frames_per_batch": fpb,
            "n_iters": n_iters,
            "num_envs": num_envs,
            "max_steps": max_steps,
            "num_epochs": args.num_epochs,
            "minibatch_size": args.minibatch_size,
            "lr": args.lr,
            "max_grad_norm": args.max_grad_norm,
            "clip_epsilon": args.clip_epsilon,
            "gamma": args.gamma,
            "lmbda": args.lmbda,
            "entropy_eps": args.entropy_eps,
            "depth": args.depth,
            "num_cells": args.num_cells,
            "share_params": True,
            "centralised_critic": not args.ippo,
            "spread_backend": args.spread_backend if args.env == "mpe_spread" else None,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "vmas": getattr(vmas, "__version__", None),
            "mpe2": _dist_version("mpe2"),
            "pettingzoo": _dist_version("pettingzoo"),
        },
    }
    text = json.dumps(result, indent=1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    summary = {
        k: result[k]
        for k in ("env", "total_frames", "train_seconds", "frames_per_second", "final_mean_episode_reward_per_agent")
    }
    print(json.dumps(summary), flush=True)
    return result


def _dist_version(name: str):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
