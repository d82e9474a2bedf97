"""Built-in attention backends (plugins can add more through entry points)."""
