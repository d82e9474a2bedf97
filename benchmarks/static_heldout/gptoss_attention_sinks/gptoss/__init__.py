"""gpt-oss-style serving: attention sinks, alternating sliding-window layers, routed experts."""
