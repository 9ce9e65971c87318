"""Test helpers that stand in for real services with exact, scripted behaviour (no mocks of the code under test)."""

from agentrl.testing.scripted_chat import Reply, ScriptedChat, count_tokens, tool_call

__all__ = ["Reply", "ScriptedChat", "count_tokens", "tool_call"]
