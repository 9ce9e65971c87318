"""What several backends share: the `Trainer` protocol (`protocol.py`), loading a model to train
(`trained_model.py`), the training forward pass (`forward.py`), the LoRA wrapping of the trained model (`lora.py`),
the weight push (`weight_push.py`), `trainer.resume` and where checkpoints go (`resume.py`), the pieces of a step
the GRPO and TRL backends share (the row order and the fill loop: `step_fill.py`; the rollout metrics:
`rollout_metrics.py`; the step's batch and report: `step_products.py`), the no-update watch (`no_update.py`) and
the reward-curve figure (`plots.py`)."""
