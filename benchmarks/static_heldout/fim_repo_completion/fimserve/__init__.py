"""Fill-in-the-middle code completion server with per-repository context pages."""
