"""FC201 host-sync-in-replay: no host sync or device-to-host copy on the per-step path (`runtime.monitor` finds it)."""

from __future__ import annotations

from flashcheck.check import Check

__all__ = ["HOST_SYNC_IN_REPLAY"]

HOST_SYNC_IN_REPLAY = Check(
    "FC201",
    "host-sync-in-replay",
    "runtime",
    doc="""\
    No host synchronization and no device-to-host copy on the per-step path, eager or graph.

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
    """,
    hint=(
        "keep host mirrors of every value the replay path needs (sequence lengths, indptr) and compute them on the "
        "host; pass host (pinned) indptr to plan(); copy host->device with non_blocking=True from pinned buffers"
    ),
)
