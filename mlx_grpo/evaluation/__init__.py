"""Evaluation: held-out accuracy, `compare` and `eval` with paired statistics, the report,
plots of a run's curves, and `inspect` of a run folder."""
