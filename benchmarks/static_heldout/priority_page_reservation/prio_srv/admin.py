"""Operator endpoints (served by the admin thread, never on the step path)."""

from __future__ import annotations

from prio_srv.graphs import BucketGraphs


def capture_stats(graphs: BucketGraphs) -> dict:
    hottest = graphs.backend.page_heat.topk(16).indices.tolist()  # ok: FC101
    return {"buckets": sorted(graphs.graphs), "hottest_pages": hottest}
