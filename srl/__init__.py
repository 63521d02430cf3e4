"""SRL: scalable distributed reinforcement learning."""
