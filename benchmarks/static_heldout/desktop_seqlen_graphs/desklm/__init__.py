"""desklm: a single-user desktop inference engine (one sequence, graphs per context-length bucket)."""
