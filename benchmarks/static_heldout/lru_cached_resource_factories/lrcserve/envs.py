"""Process-wide knobs: module constants, overridable through the environment.

Every knob has a default so that a bare launch works; the launcher exports the ones it
wants to change. `snapshot()` is cached so that every component logs the values the
process started with even if something edits os.environ later.
"""
from __future__ import annotations

import functools
import os

# Page / batch limits ----------------------------------------------------------------
PAGE_SIZE = int(os.environ.get("LRC_PAGE_SIZE", "16"))
MAX_BATCH_SIZE = int(os.environ.get("LRC_MAX_BATCH_SIZE", "160"))
SLIDING_WINDOW = int(os.environ.get("LRC_SLIDING_WINDOW", "4096"))

# FlashInfer workspaces ----------------------------------------------------------------
# Float workspace shared by the eager decode wrappers of a device. Picked by hand for the
# 8k-context benchmark the engine was brought up on.
DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024

# Ragged prefill workspace in MiB; operators raise it without a rebuild.
PREFILL_WORKSPACE_MB = int(os.environ.get("LRC_PREFILL_WORKSPACE_MB", "384"))

# Graph-mode decode workspace. Placeholder only: tune_graph_workspace() rebinds it from the
# engine limits before the first graph wrapper is built.
GRAPH_WORKSPACE_BYTES = 128 * 1024 * 1024

_WS_ALIGN = 1 << 20
assert DECODE_WORKSPACE_BYTES % _WS_ALIGN == 0, "workspace sizes are whole MiB"  # ok: FC109

# Tracing / robustness ------------------------------------------------------------------
ENABLE_NVTX = os.environ.get("LRC_NVTX", "0") == "1"
STEP_TIMING_WINDOW = int(os.environ.get("LRC_STEP_TIMING_WINDOW", "512"))
OOM_RETRIES = int(os.environ.get("LRC_OOM_RETRIES", "2"))


def tune_graph_workspace(max_rows: int, num_qo_heads: int, head_dim: int, max_kv_splits: int) -> int:
    """Size the graph workspace for the largest captured step (split-k partials + LSE)."""
    global GRAPH_WORKSPACE_BYTES
    partials = max_rows * num_qo_heads * max_kv_splits * (head_dim * 4 + 4)
    GRAPH_WORKSPACE_BYTES = max(partials + (8 << 20), 32 << 20)
    return GRAPH_WORKSPACE_BYTES


@functools.cache
def snapshot() -> dict[str, str]:
    """The LRC_* environment as the process saw it first."""
    return {k: v for k, v in os.environ.items() if k.startswith("LRC_")}
