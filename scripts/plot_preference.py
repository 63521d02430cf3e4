"""The over-optimization frontier of a preference run: each saved checkpoint's oracle score and reward-model
score against its KL from the starting model, on held-out prompts.

For every checkpoint in ``RUN_DIR/checkpoints`` (the run keeps them: ``run.keep_checkpoints``), the policy
samples one completion per held-out prompt (``split: eval``, the run's evaluation seed); the reward model and
the oracle score them, and the KL is the sampled estimate ``sum_t log pi(y_t) - log pi_ref(y_t)`` per
completion (k1, averaged). Writes ``frontier.jsonl`` in the run directory and the plot.

    python scripts/plot_preference.py RUN_DIR [RUN_DIR ...] --prompts 256 --out docs/img/rlhf_preference_frontier.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from srl.api.config import load_config
from srl.api.plugins import resolve
from srl.envs.slots import make_slot
from srl.evaluate import eval_seed
from srl.runtime.plan import make_plan
from srl.system.checkpoint import checkpoints, load_checkpoint
from srl.text.algorithm import prompt_mask
from srl.text.generate import completion_logp
from srl.text.hf import load_lm
from srl.text.task import evaluation_env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, nargs="+", help="runs of one config (e.g. several text.kl_coef)")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    runs = {str(run): score_run(run, args.prompts) for run in args.run_dir}
    if args.out is not None:
        plot(runs, args.out)


def score_run(run: Path, n_prompts: int) -> list[dict]:
    """Score every checkpoint of ``run`` (and its starting model, version 0); also written to frontier.jsonl."""
    cfg = load_config(run / "config.yaml")
    plan = make_plan(cfg)
    policy = plan.policies[0].acting_policy()
    reference = load_lm(cfg.text.model)
    oracle = resolve(cfg.text.reward_model.oracle, {}, "text.reward_model.oracle")
    task = make_slot(evaluation_env(cfg.env), n_prompts)
    rows = []
    with torch.inference_mode():
        for path in [None, *checkpoints(run / "checkpoints")]:
            version = 0
            if path is not None:
                state = load_checkpoint(path)
                policy.load_flat(state["policy_state"].numpy())
                version = int(state["version"])
            torch.manual_seed(0)
            obs = task.reset(eval_seed(cfg))  # the same held-out prompts for every checkpoint
            out = policy.act(obs)
            prompts = list(task.prompts)  # type: ignore[attr-defined]
            completions = task.completions(out["actions"])  # type: ignore[attr-defined]
            ids = torch.from_numpy(obs["obs"]).long()
            tokens = torch.from_numpy(out["actions"])
            mask = (torch.arange(tokens.shape[1])[None] < torch.from_numpy(out["length"])[:, None]).float()
            ref = completion_logp(reference, ids, prompt_mask(ids, policy.pad_id), tokens, mask, cfg.text.temperature)
            kl = float(((torch.from_numpy(out["logp"]) - ref) * mask).sum(1).mean())
            rm = float(np.mean(task.score(prompts, completions)))  # type: ignore[attr-defined]
            row = {"version": version, "kl_coef": cfg.text.kl_coef, "kl": kl, "reward_model": rm}
            row["oracle"] = float(np.mean(oracle(prompts, completions)))
            rows.append(row)
            print(json.dumps(row), flush=True)
    (run / "frontier.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def plot(runs: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, title in (
        (left, "oracle", "oracle (hidden: distinct real words)"),
        (right, "reward_model", "reward model"),
    ):
        for rows in runs.values():
            rows = sorted(rows, key=lambda r: r["kl"])
            ax.plot([r["kl"] for r in rows], [r[key] for r in rows], "o", label=f"kl_coef {rows[0]['kl_coef']}")
        ax.set_title(title)
        ax.set_xlabel("KL(policy || starting model), nats per completion")
    left.set_ylabel("mean score of held-out completions")
    left.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
