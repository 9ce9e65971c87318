"""`inference=vllm`: vLLM OpenAI servers as an engine (`engine`), their processes (`servers`) and the token-in/
token-out route one call uses (`generate`)."""
