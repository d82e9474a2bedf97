"""FC202 allocation-in-replay: no device allocation on the graph path (`runtime.monitor` finds it)."""

from __future__ import annotations

from flashcheck.check import Check

__all__ = ["ALLOCATION_IN_REPLAY"]

ALLOCATION_IN_REPLAY = Check(
    "FC202",
    "allocation-in-replay",
    "runtime",
    doc="""\
    No new device allocation, and no caching-allocator pool growth, inside the replay path.

    What it checks
        Device allocations made through torch's caching allocator inside ``prepare_replay`` / ``replay`` regions
        (the graph path; eager steps allocate their outputs by design): each one seen by the ``gpu_trace``
        allocation callback (with its Python stack); and, when the ``alloc_stats`` layer is named, the allocation
        count and reserved bytes read from the allocator statistics when a graph-path region is entered and left (a
        growth of reserved memory is reported as pool growth).

    Why it breaks serving
        A graph replays fixed addresses. A buffer allocated on the replay path is either not the one the graph
        reads (the update is silently lost) or grows the allocator's pools until the serving process runs out of
        memory; a ``cudaMalloc`` on the hot path also synchronizes the device.

    Example
        ::

            with checker.region("prepare_replay", step=i):
                positions = torch.arange(bs, device="cuda")      # FC202: fresh allocation every step
                static_positions[:bs].copy_(positions)

    Use instead
        Allocate persistent buffers once, before capture, and fill them in place (``torch.arange(bs, out=buf[:bs])``,
        ``buf[:bs].copy_(host_pinned, non_blocking=True)``).

    Known false positives
        Allocations in the first replay after a capture that a target makes lazily once (a cache warm-up) are
        reported; warm the target up outside the checked steps. Memory allocated directly with CUDA APIs in C++
        (not through torch's allocator) is invisible to this check: torch's allocator calls ``cudaMalloc`` under its
        lock, where a CUPTI callback waiting for the GIL could deadlock, so no layer watches that call.
    """,
    hint=(
        "allocate every buffer the replay path writes once, before capture, and write into it in place "
        "(out=..., copy_, slicing a persistent buffer)"
    ),
)
