"""Adapter bookkeeping for multi-LoRA serving with heterogeneous ranks."""
from mlora.adapters import AdapterSlotTable, AdapterSpec
from mlora.config import EngineConfig
from mlora.segments import SegmentInfo, group_by_adapter

__all__ = ["AdapterSlotTable", "AdapterSpec", "EngineConfig", "SegmentInfo", "group_by_adapter"]
