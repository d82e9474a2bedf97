"""Context-parallel serving: ring-attention prefill over a zigzag split, sharded decode."""

__version__ = "0.1.0"
