"""Pages of the runtime detectors FC201, FC202, FC203 (the rules themselves live in `flashcheck.runtime.monitor`)."""

from __future__ import annotations

from flashcheck.registry import register_check

__all__: list[str] = []


@register_check("FC201", "host-sync-in-replay", "runtime")
class _HostSyncInReplay:
    """No host synchronization and no device-to-host copy on the per-step path, eager or graph.

    What it checks
        Every event the detection layers see inside a per-step region (``plan`` and ``run`` of the eager path,
        ``prepare_replay`` and ``replay`` of the graph path; a target may declare a region it runs only once cold):
        a device, stream or event synchronize, a device-to-host
        copy (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``nonzero``, a boolean-mask index), and a
        host-to-device copy from pageable memory (the CUDA runtime stages it synchronously even with
        ``non_blocking=True``). The same event seen by several layers is one finding; its evidence lists the layers
        (``sync_debug``, ``dispatch``, ``gpu_trace``, ``cupti``) and its location is the user's line.

    Why it breaks serving
        The point of a CUDA graph is that the host runs ahead of the GPU. One sync on the replay path drains the
        queue every step: the host waits for the previous step's kernels, the GPU then waits for the host, and the
        decode step is as slow as eager mode (or slower). It is invisible in correctness tests and shows up as a
        throughput regression under load.

    Example
        A replay path that reads a device tensor::

            with checker.region("prepare_replay", step=i):
                seq_lens = seq_lens_dev[:bs].tolist()         # FC201: device-to-host copy
                wrapper.plan(kv_indptr_dev, ...)              # FC201: plan() copies indptr to the host

    Use instead
        Keep host mirrors (numpy or pinned CPU tensors) of every value the host needs, compute the metadata there,
        pass host indptr to ``plan()`` (FlashInfer copies it to pinned memory without a sync) and copy to the
        device with ``non_blocking=True`` from pinned buffers.

    Known false positives
        Syncs the target makes on purpose outside the replay path are not reported if they happen outside the
        hot regions; wrap deliberate checker-side reads in ``checker_read()``. A ``cudaStreamSynchronize`` issued by
        another library on the same thread inside a hot region is reported (it is a real stall).
    """


@register_check("FC202", "allocation-in-replay", "runtime")
class _AllocationInReplay:
    """No new device allocation, and no caching-allocator pool growth, inside the replay path.

    What it checks
        Device allocations made through torch's caching allocator inside ``prepare_replay`` / ``replay`` regions
        (the graph path; eager steps allocate their outputs by design): each one seen by the ``gpu_trace``
        allocation callback (with its Python stack), and the allocation count and reserved bytes read from the
        allocator statistics when a graph-path region is entered and left (``alloc_stats``; a growth of reserved
        memory is reported as pool growth).

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
        (not through torch's allocator) is invisible to this check.
    """


@register_check("FC203", "pinned-copy-captured", "runtime")
class _PinnedCopyCaptured:
    """No copy from or to pinned host memory is captured into a CUDA graph.

    What it checks
        Host-to-device and device-to-host copies whose host side is pinned, made inside a ``capture`` region (seen
        by the dispatch layer, which is always active during capture, because a capture happens once), and
        graph-executed pinned copies seen by CUPTI during ``replay``.

    Why it breaks serving
        CUDA capture accepts a ``non_blocking=True`` copy from pinned memory silently (a pageable copy is refused).
        The copy becomes a memcpy node that reads the host buffer at *replay* time: the graph keeps using whatever
        the host buffer holds when it replays, and if that buffer is reused or freed the graph reads stale or
        foreign data. No error is ever raised.

    Example
        ::

            with checker.region("capture"), torch.cuda.graph(g):
                meta_dev.copy_(meta_pinned, non_blocking=True)   # FC203: baked into the graph
                out = wrapper.run(q, kv_cache)

    Use instead
        Copy host metadata into the graph's persistent device buffers before each ``replay()`` (outside the graph),
        and capture only device-to-device work.

    Known false positives
        A pinned buffer that is deliberately part of the graph's contract (written by the host before each replay
        and never reused) works, but is fragile; suppress the finding for that line if you rely on it.
    """
