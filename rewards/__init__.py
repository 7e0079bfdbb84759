"""Reward functions and tasks, one module per domain."""
