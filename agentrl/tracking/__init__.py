"""Experiment tracking behind a small interface, so trainers never import MLflow."""

from agentrl.tracking.tracker import Tracker

__all__ = ["Tracker"]
