"""Fixed shapes of the verify step and scratch sizes."""

from typing import NamedTuple

# Jacobi lookahead tokens and n-gram candidates verified per request per step
LOOKAHEAD_WINDOW = 4
NGRAM_SIZE = 4
NUM_CANDIDATES = 4
NUM_VERIFY_TOKENS = LOOKAHEAD_WINDOW + NUM_CANDIDATES * (NGRAM_SIZE - 1)

# scratch of the ragged branch-refresh attention
BRANCH_WORKSPACE_BYTES = 64 << 20


class SpecLimits(NamedTuple):
    max_batch_size: int
    max_context_len: int
    page_size: int = 16
    verify_workspace_bytes: int = 256 << 20
    graph_batch_sizes: tuple = (1, 2, 4, 8, 16, 32)
