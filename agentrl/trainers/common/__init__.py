"""What several backends share: the `Trainer` protocol (`protocol.py`), loading a model to train
(`trained_model.py`), the training forward pass (`forward.py`), `model.lora` (`lora.py`), the weight push
(`weight_push.py`),
`trainer.resume` (`resume.py`), the pieces of a step the GRPO and TRL backends share (`step_parts.py`,
`step_products.py`), the no-update watch (`no_update.py`) and the reward-curve figure (`plots.py`)."""
