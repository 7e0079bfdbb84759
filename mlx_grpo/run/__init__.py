"""A training run: the step loop, what a step trains on, checkpoints and exact resume,
health rules, the live display, metric trackers, Ctrl-C, data-parallel ranks."""
