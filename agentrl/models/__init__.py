"""Models: `tiny` (made locally), `hf` (any local Hugging Face folder), the chat template and tool-call parsing."""

from .tool_calls import parse_tool_calls

__all__ = ["parse_tool_calls"]
