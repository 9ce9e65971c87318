"""agentrl: declarative experiments for training language-model agents with reinforcement learning."""

__version__ = "0.1.0"
