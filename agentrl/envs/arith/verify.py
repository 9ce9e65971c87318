"""Moved to `agentrl.answers` (agents check answers too, and agents never import a bundle's code).

TODO(lead): remove once `agentrl/agents/adversarial.py` imports `agentrl.answers`.
"""

from agentrl.answers import answers_match, extract_answer, normalize, to_number, verify_answer

__all__ = ["answers_match", "extract_answer", "normalize", "to_number", "verify_answer"]
