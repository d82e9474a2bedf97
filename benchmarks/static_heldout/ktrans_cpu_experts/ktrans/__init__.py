"""A KTransformers-style hybrid engine: routed experts on the CPU, attention on the GPU."""
