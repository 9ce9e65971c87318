"""Experiment tracking behind a small interface, so trainers never import MLflow."""

from agentrl.tracking.tracker import NullTracker, Tracker

__all__ = ["NullTracker", "Tracker"]
