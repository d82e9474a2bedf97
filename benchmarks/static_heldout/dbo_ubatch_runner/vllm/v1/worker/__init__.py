"""GPU worker: model runner, ubatch wrapper."""
