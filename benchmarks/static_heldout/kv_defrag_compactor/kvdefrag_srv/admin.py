"""Operator endpoints (served from the HTTP thread, never from the step loop)."""

from typing import Any, Dict

from kvdefrag_srv.engine import DefragEngine


def dump_remap_table(engine: DefragEngine) -> Dict[str, Any]:
    remap = engine.remap
    return {
        "pending": remap.pending_gpu.nonzero().flatten().tolist(),
        "map": remap.map_gpu.tolist(),  # ok: FC101
        "high_water": engine.pool.high_water,
        "fragmentation": engine.pool.fragmentation_host(),
    }
