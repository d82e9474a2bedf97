"""Engine-wide constants, re-exported by the package."""

PAGE_SIZE = 16

# Ragged prefill workspace: what the first benchmark needed, never revisited.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024

# Batch sizes the model captures a decode graph for, on first sight of each.
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
