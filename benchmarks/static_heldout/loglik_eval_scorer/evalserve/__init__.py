"""Evaluation-harness server: log-likelihood scoring of continuations and generate-until."""
