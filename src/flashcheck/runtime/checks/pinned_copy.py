"""FC203 pinned-copy-captured: no pinned host copy captured into a graph (`runtime.monitor` finds it)."""

from __future__ import annotations

from flashcheck.check import Check

__all__ = ["PINNED_COPY_CAPTURED"]

PINNED_COPY_CAPTURED = Check(
    "FC203",
    "pinned-copy-captured",
    "runtime",
    doc="""\
    No copy from or to pinned host memory is captured into a CUDA graph.

    What it checks
        Host-to-device and device-to-host copies whose host side is pinned, made inside a ``capture`` region while
        the stream captures (seen by the dispatch layer, which is always active during capture, because a capture
        happens once). A graph captured outside every ``capture`` region is not watched: no layer sees the copies a
        graph runs at replay.

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
    """,
    hint=(
        "do not capture copies from or to pinned host memory: the graph reads or writes the host buffer at replay "
        "time, not at capture time; copy into the graph's persistent device buffers before replay() instead"
    ),
)
