"""Early-exit decoding: a confidence head picks how many layer groups run each step."""
