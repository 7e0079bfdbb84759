"""The policy update: group advantages, rollouts as micro-batches, token log-probs, their
gradients (gradients.py), and the policy-gradient objectives (losses.py, beside DESIGN's formulas)."""
