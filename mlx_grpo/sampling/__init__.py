"""Sampling: batched rollouts with exact token ids, behaviour log-probs and finish reasons;
the compiled fixed-shape decoder; multi-turn episodes against an environment."""
