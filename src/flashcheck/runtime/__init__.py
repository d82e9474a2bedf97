"""Runtime checker: hooks torch/CUDA events into a pure monitor, a workspace arena, runtime properties."""
