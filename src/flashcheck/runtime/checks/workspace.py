"""FC302 workspace-within-bounds: kernels stay inside their workspaces (`runtime.arena` scans for it)."""

from __future__ import annotations

from flashcheck.check import Check

__all__ = ["WORKSPACE_WITHIN_BOUNDS"]

WORKSPACE_WITHIN_BOUNDS = Check(
    "FC302",
    "workspace-within-bounds",
    "property",
    doc="""\
    Every workspace a kernel writes stays inside the bytes allocated for it.

    What it checks
        Workspaces handed out by the checker's arena (float, int, pinned host, engine-owned) have guard zones
        before and after the usable region, filled with a pattern. Before each step the usable region is filled
        with a sentinel byte that alternates between 0xA5 and 0x5A; after the step the arena scans for the
        high-water mark (the last byte that differs from the sentinel) and checks that both guard zones are intact.
        A written guard zone is a finding naming the workspace, the number of bytes and their offsets. Usage
        (used vs allocated bytes) is reported per workspace and step.

    Why it breaks serving
        FlashInfer carves its float, int and pinned workspaces itself. A workspace sized for a smaller batch than
        the graph replays, or a planner bug, writes past the end into whatever the caching allocator put next: a
        KV-cache page, another wrapper's buffer. The pinned host buffer is copied with an unchecked ``std::copy``,
        so its overflow is silent.

    Example
        ::

            ws = checker.arena.workspace("float", 1 << 20, device="cuda")   # sized for bs=8
            wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, ...)
            # replaying bs=256 -> FC302: 18,432 bytes written in the guard zone after `float`

    Use instead
        Size workspaces for every batch the engine can plan: ``flashcheck workspace --config engine.toml`` gives
        the worst case and its witness batch (FC306); FlashInfer 0.7.2's ``wrapper.workspace_size(...)`` answers
        for one batch. Give each wrapper that plans concurrently its own int and pinned buffer.

    Known false positives
        A workspace shared by sibling wrappers shows the largest user's high-water mark, not each user's. The
        guard-zone pattern alternates between steps, so data that equals the pattern cannot hide an overflow for
        two steps in a row, but it can for one.
    """,
)
