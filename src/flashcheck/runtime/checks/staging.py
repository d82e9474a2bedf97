"""FC204 pinned-staging-reused-in-flight: the host never touches a pinned staging buffer while a non_blocking copy of
it is in flight (the state machine lives in `flashcheck.runtime.staging`, the torch adapter in
`flashcheck.runtime.hooks.staging`)."""

from __future__ import annotations

from flashcheck.check import Check

__all__ = ["PINNED_STAGING_REUSED_IN_FLIGHT"]

PINNED_STAGING_REUSED_IN_FLIGHT = Check(
    "FC204",
    "pinned-staging-reused-in-flight",
    "runtime",
    doc="""\
    The host never touches a pinned staging buffer while a non_blocking copy of it is still in flight.

    What it checks
        The ``staging`` layer (``layers="races"``) watches every ``non_blocking=True`` copy whose host side is pinned
        memory: ``dst.copy_(pinned, non_blocking=True)`` and ``pinned.to(device, non_blocking=True)`` (host to
        device, the pinned source), ``pinned.copy_(dev, non_blocking=True)`` and ``dev.to("cpu", non_blocking=True)``
        (device to host, the pinned destination). It records a CUDA event on the current stream right after each
        copy. Until that event has completed (``event.query()``), a host write to any byte of the copy's host range
        (a torch in-place op, ``copy_``, ``fill_``, ``zero_``, index assignment, on the tensor or on any view that
        overlaps it: ranges are matched by address), or a host read of a device-to-host destination (``.item()``,
        ``.tolist()``, ``.numpy()``, indexing, any torch op reading it), is a finding. The finding is located at the
        host access and carries both stacks: the access's as its stack, the copy's in ``evidence.copy_stack``.
        On an idle GPU a small copy usually completes before the host gets to its next line, so the layer delays
        the stream before each tracked copy so that the copy stays in flight at least ``hold_us`` (3 ms by default)
        after it is issued: a host access within that time of a copy it does not wait for is reported on every
        run, not only when the timing happens to lose. The delays top each other up (a region of many copies
        costs about ``hold_us`` of device time plus its host time).

    Why it breaks serving
        ``non_blocking=True`` from pinned memory returns before the copy has run: the DMA engine reads the host
        buffer whenever the stream reaches the copy. An engine that rewrites the pinned mirror of ``kv_indptr`` or
        ``last_page_len`` for the next batch right after enqueuing this batch's copy (an overlap scheduler preparing
        step N+1 while step N runs, a pinned metadata buffer reused across steps) makes the GPU read the next
        step's metadata for this step. The kernel attends to the wrong pages or token counts; nothing raises. On
        an idle GPU the copy usually wins the race, so the bug appears only under load. Reading a device-to-host
        destination before its event completed returns whatever the buffer held before.

    Example
        ::

            self.last_page_len_gpu.copy_(self.last_page_len_pinned, non_blocking=True)
            self.wrapper.plan(...)
            self.last_page_len_pinned.fill_(page_size)   # FC204: next batch written while the copy is in flight

    Use instead
        Record an event after the copy and wait on it (``event.synchronize()``, or skip the buffer while
        ``event.query()`` is False) before writing the pinned buffer again; or keep one pinned buffer per step in
        flight (double buffering); read a device-to-host result only after its event completed.

    Known false positives
        Calling ``.numpy()`` on a device-to-host destination counts as a read although it only makes a view: an
        engine that takes the view early and reads it after waiting on the event is reported. Ranges are the
        extent of the copied view, not its elements: a host write to bytes inside a strided copy's extent that
        the copy does not transfer (a column of a row-major buffer next to the copied one) is reported.
        Not seen (false negatives): writes through numpy views of the pinned tensor (``pinned.numpy()[i] = v``
        writes through the buffer protocol without dispatching a torch op; the ``.numpy()`` call itself is seen
        as a read of a device-to-host destination), writes from C++ (FlashInfer's own ``plan()`` writes its pinned
        int workspace and copies it with ``cudaMemcpyAsync`` in C++: neither side is visible), copies issued from
        C++ or with ``cudaMemcpyAsync`` directly, and accesses outside the per-step regions (``plan``, ``run``,
        ``prepare_replay``, ``replay``). Copies issued while a stream is capturing a graph are FC203's, not tracked.
    """,
    hint=(
        "wait for the copy before touching its host buffer again: record an event after the non_blocking copy and "
        "synchronize it (or check event.query()) before the next write, or double-buffer the pinned mirror (one buffer "
        "per step in flight); read a device-to-host result only after its event completed"
    ),
    layer="staging",
)
