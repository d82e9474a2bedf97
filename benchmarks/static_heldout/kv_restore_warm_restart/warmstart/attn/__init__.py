"""Attention for the warm-restart engine."""
