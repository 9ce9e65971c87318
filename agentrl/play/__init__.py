"""Playing rows, shared by every trainer and by `agentrl eval`: the services a run starts (engine, session server,
env server), the rollout runner, who plays what (`policies.py`), the dependency watch (the circuit breaker,
`dependency_breaker.py`), episode traces, and the evals with their results files. Nothing here trains: the
trainers (`agentrl.trainers`) build on it, never the other way round."""
