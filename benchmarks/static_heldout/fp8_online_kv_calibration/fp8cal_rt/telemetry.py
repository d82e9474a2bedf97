"""Prometheus-style export of the calibration state (scraped by the metrics thread)."""
from __future__ import annotations

from typing import Dict, List


def export_scales(engine) -> Dict[str, List[float]]:
    k = engine.cache.k_scale.cpu().tolist()  # ok: FC101
    v = engine.cache.v_scale.cpu().tolist()
    return {"fp8_k_scale": k, "fp8_v_scale": v, "calibrated_steps": [float(engine.observer.steps_seen)]}
