"""`inference=embedded`: transformers on this machine with continuous batching (`engine`), in a child process of
its own with `inference.process=true` (`process`), and the engine's internals (batch, KV cache, shared prefix,
packed linears, weights and adapters)."""
