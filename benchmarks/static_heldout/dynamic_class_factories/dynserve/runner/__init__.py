"""Graph runner and model runner."""
