"""Peer baseline: TRL 1.16's ``GRPOTrainer`` on srl's arithmetic task (``configs/rlhf_arithmetic.yaml``).

Written for this project. It trains the same fine-tuned Llama (a Hugging Face folder, loaded offline) with
the same prompts (``srl.text.arithmetic.prompts``), the same reward (``srl.text.arithmetic.exact_match``, or with
``--reverse`` ``exact_match_reversed``, the shipped config's)
and srl's GRPO settings, so that the two can be run side by side. See ``TRL.md`` beside this file for the venv
and the command lines.

Settings mirrored from ``configs/rlhf_arithmetic.yaml`` (and srl's defaults):

- 8 completions per prompt (``num_generations``), 16 prompts = 128 completions per generation batch
  (``generation_batch_size``); ``--minibatches 1`` (default): one optimizer step on all 128; ``--minibatches 2``:
  two steps of 64 completions each on the same batch, as srl's ``ppo.minibatches: 2`` does;
- ``max_completion_length`` ``--max-new`` (5), temperature 1.0, top_p 1.0, top_k off;
- Adam (AdamW with weight decay 0) at ``--lr`` (1e-4), eps 1e-5 (srl's ``ppo.adam_eps``), constant LR, no warmup;
- KL leash in the loss, k3 estimator, beta 0.01 against the frozen starting model;
- one pass over each batch (``num_iterations`` 1), clip 0.2, global grad-norm clip 1.0;
- advantages: group mean subtracted, divided by the group's sample std (``scale_rewards="group"``);
- loss: per-token surrogate averaged over the valid completion tokens of the optimizer step's batch
  (``loss_type="bnpo"``; with one process and no gradient accumulation this is what ``"dapo"``, TRL's default,
  computes too when ``--minibatches 1``);
- CPU, fp32, 2 torch threads, no gradient checkpointing, no logging to any service (``report_to="none"``),
  the hub offline (``HF_HUB_OFFLINE=1``, ``local_files_only``).

Output (``--out``, JSONL): one line per optimizer step, then one summary line. Each step line has ``wall_s``
(seconds since the process started), ``step``, ``reward`` (mean exact-match reward of the completions that
step trained on), ``gen_tokens`` (completion tokens generated in that step, ``<eos>`` included, as TRL counts
them: up to and including the first ``<eos>``), ``gen_tokens_total``, ``trained_tokens`` (the completion
tokens whose loss went through backward in that step), ``gen_s`` (seconds spent in generation: tokenizing,
``model.generate``, decoding) and ``train_s`` (the rest of the step: reward, reference and policy
forwards, backward, optimizer), plus TRL's own logged metrics (``loss``, ``kl``, ``grad_norm``, ...). The
summary line (``"summary": true``) has ``total_wall_s``, ``train_loop_s``, ``gen_tokens_per_s`` (generated
completion tokens per second of wall time of the training loop), ``gen_tokens_per_s_after_first`` (the same,
counted from the end of the first step, as srl's ``tokens_per_second``), ``gen_tokens_per_gen_s`` (per second
spent generating), and ``trained_tokens_per_s`` (trained completion tokens per second of ``train_s``, i.e. time
outside generation).

``--generate-only`` measures the ceiling: ``model.generate`` alone on the same batch shape (16 prompts x 8 =
128 rows, left-padded), sampling as TRL does, ``--repeats`` times after one warm-up call; it prints one JSON
line with completion tokens/s.
"""

from __future__ import annotations

from peer_env import T0, time_generate  # first: the clock starts, the hubs go offline, the repository joins sys.path

# isort: split
import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from srl.text import arithmetic

NUM_GENERATIONS = 8
PROMPTS_PER_BATCH = 16
BATCH = NUM_GENERATIONS * PROMPTS_PER_BATCH  # 128 completions per generation batch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="/work/peers/arith_sft", help="local HF folder (read only)")
    p.add_argument("--out", default="runs/peers/trl_arithmetic.jsonl", help="JSONL log (training mode)")
    p.add_argument("--max-steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", type=int, default=3, help="operands of 1 to this many digits (prompt_args.digits)")
    p.add_argument("--max-new", type=int, default=5, help="max completion tokens (env.kwargs.max_new_tokens)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--reverse", action="store_true", help="answers units first (exact_match_reversed, the shipped config's)"
    )
    p.add_argument("--max-seconds", type=float, default=None, help="stop after the step that passes this wall time")
    p.add_argument("--prompts", type=int, default=20_000, help="training prompts in the dataset")
    p.add_argument(
        "--minibatches",
        type=int,
        default=1,
        choices=(1, 2, 4, 8),
        help="optimizer steps per 128-completion batch (srl's ppo.minibatches)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--generate-only", action="store_true", help="time model.generate alone and exit")
    p.add_argument("--repeats", type=int, default=20, help="--generate-only: timed generate calls")
    return p.parse_args()


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True, padding_side="left")
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1, (tok.pad_token_id, tok.eos_token_id)
    # TRL tokenizes plain-text prompts with the tokenizer's defaults; this tokenizer adds no special tokens,
    # so that is the same as srl's add_special_tokens=False.
    probe = "482+39="
    assert tok(probe)["input_ids"] == tok(probe, add_special_tokens=False)["input_ids"]
    return tok


def count_completion_tokens(completion_ids: torch.Tensor, eos_id: int) -> int:
    """Tokens up to and including the first ``eos_id`` in each row (all of a row without one)."""
    is_eos = completion_ids == eos_id
    has = is_eos.any(dim=1)
    first = torch.where(
        has, is_eos.int().argmax(dim=1) + 1, torch.full_like(has, completion_ids.size(1), dtype=torch.long)
    )
    return int(first.sum())


# ----------------------------------------------------------------------------------------------- generate-only
def generate_only(args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=torch.float32)
    model.eval()
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    kwargs = dict(  # what GRPOTrainer passes to generate (trl/trainer/grpo_trainer.py)
        max_new_tokens=args.max_new,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=[tok.eos_token_id],
    )

    def batch():
        prompts = [arithmetic.prompts(rng, "train", args.digits) for _ in range(PROMPTS_PER_BATCH)]
        rows = [p for p in prompts for _ in range(NUM_GENERATIONS)]
        return tok(rows, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)

    record = time_generate(
        model, batch, kwargs, args.repeats, lambda c: count_completion_tokens(c, tok.eos_token_id), {"rows": BATCH}
    )
    print(json.dumps(record))


# ----------------------------------------------------------------------------------------------------- training
class Meter:
    """Per-step counters filled by the reward function, the trainer's timing hooks and read by the callback."""

    def __init__(self) -> None:
        self.gen_s = 0.0  # generation time since the last optimizer step
        self.gen_tokens = 0  # completion tokens generated since the last optimizer step
        self.gen_tokens_total = 0
        self.gen_s_total = 0.0
        self.trained_tokens = 0  # completion tokens through backward since the last optimizer step
        self.trained_tokens_total = 0
        self.train_s_total = 0.0
        self.rewards: list[float] = []  # rewards of the completions trained on since the last step
        self.last_rewards: list[float] = []  # the reward function's last output, in row order
        self.step_begin: float | None = None
        self.first_end: float | None = None  # end of the first optimizer step
        self.first_tokens = 0  # generated tokens by then
        self.last_end: float | None = None
        self.loop_begin: float | None = None


def make_reward(meter: Meter, reverse: bool = False):
    score = arithmetic.exact_match_reversed if reverse else arithmetic.exact_match

    def exact_match_reward(prompts, completions, completion_ids=None, **kwargs):
        """TRL's reward signature: lists of prompt and completion strings (one per completion), plus kwargs."""
        rewards = score(list(prompts), list(completions))
        meter.last_rewards = rewards
        if completion_ids is not None:
            n = sum(len(ids) for ids in completion_ids)
            meter.gen_tokens += n
            meter.gen_tokens_total += n
        return rewards

    return exact_match_reward


def main_train(args: argparse.Namespace) -> None:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    meter = Meter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.open("w")

    rng = np.random.default_rng(args.seed)
    dataset = Dataset.from_dict(
        {"prompt": [arithmetic.prompts(rng, "train", args.digits) for _ in range(args.prompts)]}
    )
    tok = load_tokenizer(args.model)

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer, timed: generation (``_generate``) and the completions each micro-batch trains on."""

        def _generate(self, prompts):
            t = time.perf_counter()
            result = super()._generate(prompts)
            dt = time.perf_counter() - t
            meter.gen_s += dt
            meter.gen_s_total += dt
            return result

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                meter.trained_tokens += int(inputs["completion_mask"].sum())
                meter.rewards.extend(inputs["peer_reward"].tolist())
            inputs = {k: v for k, v in inputs.items() if k != "peer_reward"}
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            # each row's reward rides along with the batch, so it is shuffled and split into minibatches with it
            batch["peer_reward"] = torch.tensor(meter.last_rewards, dtype=torch.float32)
            return batch

    class JsonlCallback(TrainerCallback):
        def __init__(self) -> None:
            self.pending: dict | None = None

        def on_train_begin(self, a, state, control, **kw):
            meter.loop_begin = time.perf_counter()

        def on_step_begin(self, a, state, control, **kw):
            meter.step_begin = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            now = time.perf_counter()
            step_s = now - meter.step_begin
            train_s = step_s - meter.gen_s
            meter.train_s_total += train_s
            meter.trained_tokens_total += meter.trained_tokens
            if meter.first_end is None:  # rates "after the first step" count from here (warm-up left out)
                meter.first_end, meter.first_tokens = now, meter.gen_tokens_total
            meter.last_end = now
            self.pending = {
                "wall_s": round(now - T0, 4),
                "step": state.global_step,
                "reward": float(np.mean(meter.rewards)) if meter.rewards else float("nan"),
                "gen_tokens": meter.gen_tokens,
                "gen_tokens_total": meter.gen_tokens_total,
                "trained_tokens": meter.trained_tokens,
                "step_s": round(step_s, 4),
                "gen_s": round(meter.gen_s, 4),
                "train_s": round(train_s, 4),
            }
            meter.gen_s, meter.gen_tokens, meter.trained_tokens, meter.rewards = 0.0, 0, 0, []
            if args.max_seconds is not None and now - T0 >= args.max_seconds:
                control.should_training_stop = True

        def on_log(self, a, state, control, logs=None, **kw):
            if self.pending is None or logs is None or "loss" not in logs:
                return
            keep = (
                "loss",
                "grad_norm",
                "learning_rate",
                "kl",
                "entropy",
                "reward_std",
                "frac_reward_zero_std",
                "completions/mean_length",
                "completions/clipped_ratio",
                "clip_ratio/region_mean",
            )
            self.pending.update({f"trl/{k}": logs[k] for k in keep if k in logs})
            self.flush()

        def flush(self) -> None:
            if self.pending is not None:
                log.write(json.dumps(self.pending) + "\n")
                log.flush()
                self.pending = None

    callback = JsonlCallback()
    per_step = BATCH // args.minibatches
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_arith_"),
        seed=args.seed,
        data_seed=args.seed,
        max_steps=args.max_steps,
        # batch shape: 16 prompts x 8 completions per generation; `per_device_train_batch_size` counts completions
        num_generations=NUM_GENERATIONS,
        per_device_train_batch_size=per_step,
        gradient_accumulation_steps=1,
        steps_per_generation=args.minibatches,  # generation_batch_size = per_step * minibatches = 128
        num_iterations=1,
        shuffle_dataset=True,
        # generation
        max_completion_length=args.max_new,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        # loss
        beta=0.01,
        epsilon=0.2,
        loss_type="bnpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        importance_sampling_level="token",
        # optimizer
        learning_rate=args.lr,
        optim="adamw_torch",
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        # machine
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,  # TRL defaults it to True; transformers 5 calls it activation_checkpointing
        activation_checkpointing=False,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32", "local_files_only": True},
        # logging: every step, locally only
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        push_to_hub=False,
    )
    assert config.generation_batch_size == BATCH, config.generation_batch_size
    trainer = TimedGRPOTrainer(
        model=args.model,
        reward_funcs=make_reward(meter, args.reverse),
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[callback],
    )
    assert not trainer.model.is_activation_checkpointing and trainer.model.dtype == torch.float32
    assert trainer.ref_model is not None and trainer.args.device.type == "cpu"
    torch.set_num_threads(args.threads)
    trainer.train()
    callback.flush()
    loop_s = time.perf_counter() - meter.loop_begin
    total = time.perf_counter() - T0
    summary = {
        "summary": True,
        "steps": trainer.state.global_step,
        "total_wall_s": round(total, 3),
        "train_loop_s": round(loop_s, 3),
        "gen_s": round(meter.gen_s_total, 3),
        "train_s": round(meter.train_s_total, 3),
        "gen_tokens": meter.gen_tokens_total,
        "trained_tokens": meter.trained_tokens_total,
        "gen_tokens_per_s": round(meter.gen_tokens_total / loop_s, 2),
        "gen_tokens_per_gen_s": round(meter.gen_tokens_total / max(meter.gen_s_total, 1e-9), 2),
        "gen_tokens_per_s_after_first": round(
            (meter.gen_tokens_total - meter.first_tokens) / max(meter.last_end - meter.first_end, 1e-9), 2
        )
        if meter.first_end is not None and meter.last_end > meter.first_end
        else None,
        "trained_tokens_per_s": round(meter.trained_tokens_total / max(meter.train_s_total, 1e-9), 2),
        "trained_tokens_per_s_basis": "train_s: step time outside generation (reward, ref/policy fwd, bwd, optim)",
        "completions_per_step": per_step,
        "threads": torch.get_num_threads(),
        "loss_type": config.loss_type,
        "scale_rewards": config.scale_rewards,
    }
    log.write(json.dumps(summary) + "\n")
    log.close()
    print(json.dumps(summary))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.generate_only:
        generate_only(args)
    else:
        main_train(args)


if __name__ == "__main__":
    main()
