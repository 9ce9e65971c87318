"""Trainer backends: built-in GRPO and SFT on one machine, Miles beyond it."""
