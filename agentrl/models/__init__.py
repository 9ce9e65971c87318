"""Models: `tiny` (made locally), `hf` (any local Hugging Face folder), the chat template and tool-call parsing.

Importing this package is cheap: torch and transformers load only when a model is built or loaded.
"""

from .corpus import chat_template
from .hf import load_model_and_tokenizer, local_model
from .tiny import ensure_tiny_model
from .tool_calls import parse_tool_calls

__all__ = ["chat_template", "ensure_tiny_model", "load_model_and_tokenizer", "local_model", "parse_tool_calls"]
