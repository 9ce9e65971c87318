"""Agent patterns: how a rollout plays an episode through an OpenAI-compatible chat endpoint."""
