"""Trainer backends, one package each: `grpo` (built in), `sft` (and the warm start grpo and trl start from),
`trl` (TRL's trainers under accelerate) and `miles` (Ray + Megatron + SGLang); `common` holds what several of them
share. What training shares with `agentrl eval` (rollouts, services, evals) is `agentrl.play`, below this layer."""
