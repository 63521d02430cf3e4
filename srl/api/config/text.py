"""The ``text`` section: fine-tuning a language model by RL (``algorithm: lm_ppo``; the task is ``env``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class LMSpec:
    """A causal LM to build from scratch: its architecture and size (``text.base.model``)."""

    arch: Literal["gpt2", "llama", "qwen2"] = "llama"
    """The ``transformers`` architecture."""
    layers: int = 4
    """Transformer blocks."""
    width: int = 128
    """Hidden size."""
    heads: int = 4
    """Attention heads."""
    kv_heads: int | None = None
    """Grouped-query attention heads (Llama, Qwen2); None: as many as ``heads``."""
    mlp: int | None = None
    """Feed-forward width; None: 4x ``width`` (GPT-2) or 8/3x rounded to 32 (Llama, Qwen2)."""
    context: int = 256
    """Positions the model can attend over (prompt and completion together)."""

    def __post_init__(self) -> None:
        for name in ("layers", "width", "heads", "context"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.width % self.heads == 0, "width", f"{self.width} is not a multiple of heads {self.heads}")
        check(
            self.kv_heads is None or (self.kv_heads >= 1 and self.heads % self.kv_heads == 0),
            "kv_heads",
            f"heads {self.heads} are not a multiple of kv_heads {self.kv_heads}",
        )
        check(self.mlp is None or self.mlp >= 1, "mlp", f"must be >= 1, got {self.mlp}")


@dataclass(frozen=True, kw_only=True)
class TextBaseConfig:
    """How to make ``text.model`` when its folder is missing: a tokenizer and a small causal LM trained here on a
    corpus by next-token prediction (the pipeline's first step), cached in the folder for later runs."""

    corpus: str | None = None
    """``package.module:function`` with ``function(rng, n, **corpus_args)``: n training documents (strings, or
    ``(prompt, completion)`` pairs for supervised fine-tuning)."""
    corpus_args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the corpus function (its own settings)."""
    model: LMSpec = field(default_factory=LMSpec)
    """The architecture and size of the model to train."""
    steps: int = 2000
    """Optimizer steps."""
    batch_size: int = 64
    """Documents per step."""
    lr: float = 1e-3
    """Peak learning rate (linear warm-up over 5% of the steps, then linear decay)."""
    vocab_size: int = 258
    """Tokenizer vocabulary (byte-level BPE; 258 is the 256 bytes, pad and end-of-sequence: no merges)."""
    seed: int = 0
    """Seed of the corpus draws and the initialization."""

    def __post_init__(self) -> None:
        check(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}")
        check(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(
            self.vocab_size >= 258,
            "vocab_size",
            f"must be >= 258 (the bytes and two special tokens), got {self.vocab_size}",
        )


@dataclass(frozen=True, kw_only=True)
class RewardModelConfig:
    """How to make a Bradley-Terry reward model when its folder is missing (the pipeline's second step): pairs of
    completions sampled from ``text.model`` for the task's prompts, labelled by a hidden oracle."""

    folder: str | None = None
    """The reward-model folder (the task uses it through ``env.kwargs.reward:
    srl.text.reward_model:RewardModelScorer`` with ``reward_args: {folder: ...}``)."""
    oracle: str | None = None
    """``package.module:function(prompts, completions) -> list[float]`` that labels each pair (hidden from
    training; score it afterwards to see over-optimization)."""
    pairs: int = 4096
    """Preference pairs sampled for training (ties are dropped)."""
    steps: int = 600
    """Optimizer steps."""
    batch_size: int = 64
    """Pairs per step."""
    lr: float = 3e-4
    """Learning rate."""
    seed: int = 0
    """Seed of the prompts, the samples and the initialization."""

    def __post_init__(self) -> None:
        check(self.pairs >= 1, "pairs", f"must be >= 1, got {self.pairs}")
        check(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}")
        check(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")


@dataclass(frozen=True, kw_only=True)
class TextConfig:
    """The policy's language model, how it generates, and how PPO or GRPO trains it over tokens. The task (the
    prompts, the reward, the completion budget, stop strings, GRPO's group size) is the env:
    ``env.id: srl.text.task:TextTask`` with its ``env.kwargs``."""

    model: str | None = None
    """A local Hugging Face model folder (``config.json``, safetensors weights, tokenizer): the policy starts
    from it, and it is the frozen reference unless ``reference`` names another. Never downloaded."""
    reference: str | None = None
    """The frozen reference model's folder for the KL leash; None: ``model``."""
    temperature: float = 1.0
    """Sampling temperature; log-probs (behaviour, proximal, reference) are all taken at this temperature."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the smallest set of tokens holding this much probability."""
    advantage: Literal["gae", "group"] = "gae"
    """``gae``: PPO with a critic (a value head on its own copy of ``model``, trained here and never sent to the
    generators), GAE over tokens. ``group``: GRPO, each completion's score against its group's
    (``env.kwargs.group_size`` completions of one prompt), no critic."""
    group_scale: bool = True
    """GRPO: divide by the group's standard deviation (false: Dr. GRPO's unscaled form)."""
    kl_coef: float = 0.05
    """Weight of the KL leash to the reference model; 0 turns it off."""
    kl_in: Literal["reward", "loss"] = "reward"
    """Where the leash acts: a per-token penalty in the rewards (PPO-RLHF), or a term of the loss (GRPO)."""
    kl_estimator: Literal["k1", "k2", "k3"] | None = None
    """The per-token KL estimator; None: ``k1`` in the reward, ``k3`` in the loss."""
    reference_on: Literal["trainer", "generator"] = "trainer"
    """Where the reference's log-probs of each completion are taken: in the trainer, a no-grad pass over each
    batch, or in the generator (the policy worker, or the actor under inline inference) right after it samples,
    so they travel in the sample as ``ref_logp`` and the trainer never holds the reference. The generator then
    keeps a second model; it pays where the generators have time to spare (they wait on the trainer)."""
    value_head_init: float = 0.0
    """Std of the value head's initial weights (0: values start at 0)."""
    critic_thread: bool = True
    """PPO with a critic: the trainer runs the critic's passes (its values of a batch, its forward and backward in
    each minibatch) on a thread of their own, beside the policy's. The numbers are the same (the two networks
    share no parameter, so their gradients are apart); the update takes about as long as the longer of the two
    where a second core has time to spare, as it does while the generators wait on the trainer. False: one after
    the other, on the trainer's one thread."""
    base: TextBaseConfig = field(default_factory=TextBaseConfig)
    """How to make ``model`` when its folder is missing (pre-training here)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """How to make a reward model when its folder is missing (after ``base``)."""

    def __post_init__(self) -> None:
        check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        check(self.kl_coef >= 0, "kl_coef", f"must be >= 0, got {self.kl_coef}")
        check(self.value_head_init >= 0, "value_head_init", f"must be >= 0, got {self.value_head_init}")

    @property
    def estimator(self) -> Literal["k1", "k2", "k3"]:
        """The KL estimator in use."""
        if self.kl_estimator is not None:
            return self.kl_estimator
        return "k1" if self.kl_in == "reward" else "k3"
