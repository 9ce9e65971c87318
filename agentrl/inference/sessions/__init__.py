"""The token-in/token-out session server (OpenAI chat completions per session): the app (`app`), its in-process
runner (`server`), request schema and limits, chat rendering (`tito`, `prompt_tokens`) and the samples trainers
get from a session's turns (`samples`). `python -m agentrl.inference.serve` serves it on its own."""
