"""Operator metrics, read on demand from the admin endpoint."""

from typing import Dict

from budget_rt.engine import MixedEngine


def step_report(engine: MixedEngine) -> Dict[str, float]:
    m = engine.meta
    rows = m.num_decodes + m.num_prefills
    return {
        "kv_pages": float(m.kv_indptr[rows].item()),  # ok: FC101
        "queued": float(len(engine.scheduler.waiting)),
        "running": float(len(engine.scheduler.running)),
    }
