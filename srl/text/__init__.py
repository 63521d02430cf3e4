"""Language models as an RL workload: a text task whose episodes are completions, generation in policy
workers, and PPO or GRPO over tokens with a KL leash to a frozen reference (see ``docs/architecture.md``)."""
