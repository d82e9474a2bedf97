"""Generation of batch shapes and replay scenarios (strategies, state machines, campaign workers)."""
