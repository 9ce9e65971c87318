"""agentrl: declarative experiments for training language-model agents with reinforcement learning."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# OpenMP threads that wait at a barrier sleep instead of spinning, unless the user chose otherwise. On a small
# shared box a spinning torch thread fights every other job for its core: beside one busy process the 2-thread
# SFT warm start slowed 3.4x with libgomp's default wait and 1.4x with PASSIVE, which costs 1.35x on an idle box
# (benchmarks/RESULTS.md, "Threads under a competing process").
# libgomp reads this once, when torch loads it, so it is set before anything imports torch.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
