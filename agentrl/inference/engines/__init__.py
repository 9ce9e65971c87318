"""The inference engines: what samples tokens for the session server and takes the learner's weight pushes.

`protocol` (the `Engine` interface and the capabilities each engine class declares), `completion` (what every
engine returns), `embedded/` (transformers in this process or a child of its own: `inference=embedded`), `vllm/`
and `sglang` (engines on servers elsewhere: `inference=vllm`, `inference=sglang`) and what those two share
(`server_backed`, `remote_adapters`, `weight_folders`, the last also the engine process's).
"""
