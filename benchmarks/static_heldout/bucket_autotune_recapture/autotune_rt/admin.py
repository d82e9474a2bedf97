"""Operator endpoints, called from the HTTP thread."""

from typing import Any, Dict

from autotune_rt.server import AutotuneServer


def capture_histogram_snapshot(server: AutotuneServer) -> Dict[str, Any]:
    """The batch-size histogram as the GPU counted it, beside the decayed host one and the buckets."""
    if server.hist_dev is None:
        return {"buckets": list(server.recap.buckets)}
    return {
        "device_counts": server.hist_dev.tolist(),  # ok: FC101
        "host_counts": server.hist.counts_np.round(2).tolist(),
        "buckets": list(server.recap.buckets),
    }
