"""Token healing with constrained re-decoding of the prompt's last tokens."""
