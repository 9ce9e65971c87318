"""Where an episode runs: in the server's process (`local`) or in a container per episode (`docker`)."""
