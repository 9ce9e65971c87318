"""Environment bundles, their episodes, and the server that plays them over the OpenEnv protocol."""
